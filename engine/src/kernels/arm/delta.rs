//! The Gated DeltaNet state step (`scalar::delta_step`) with NEON: eight lanes of fused
//! multiply-adds in two registers (lanes 0–3 and 4–7), summed as `scalar::reduce8` sums them,
//! the tail as the reference takes it.

use std::arch::aarch64::*;

/// `scalar::reduce8` of lanes 0–3 in `lo` and 4–7 in `hi`.
#[target_feature(enable = "neon")]
fn reduce8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    let quads = vaddq_f32(lo, hi);
    let pairs = vadd_f32(vget_low_f32(quads), vget_high_f32(quads));
    vget_lane_f32::<0>(pairs) + vget_lane_f32::<1>(pairs)
}

/// See `scalar::delta_step`; only called on `Isa::Neon`.
pub fn delta_step(
    s: &mut [f32],
    qkv: (&[f32], &[f32], &[f32]),
    gates: (f32, f32, f32),
    out: &mut [f32],
) {
    // SAFETY: NEON was detected at run time.
    unsafe { delta_step_neon(s, qkv, gates, out) }
}

#[target_feature(enable = "neon")]
fn delta_step_neon(
    s: &mut [f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    (decay, beta, scale): (f32, f32, f32),
    out: &mut [f32],
) {
    let width = k.len();
    let body = width / 8 * 8;
    let decays = vdupq_n_f32(decay);
    for ((row, &v), o) in s.chunks_exact_mut(width).zip(v).zip(out) {
        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        for (x, k) in row[..body].chunks_exact_mut(8).zip(k.chunks_exact(8)) {
            // SAFETY: eight values each side.
            unsafe {
                let a = vmulq_f32(vld1q_f32(x.as_ptr()), decays);
                let b = vmulq_f32(vld1q_f32(x.as_ptr().add(4)), decays);
                vst1q_f32(x.as_mut_ptr(), a);
                vst1q_f32(x.as_mut_ptr().add(4), b);
                lo = vfmaq_f32(lo, a, vld1q_f32(k.as_ptr()));
                hi = vfmaq_f32(hi, b, vld1q_f32(k.as_ptr().add(4)));
            }
        }
        let mut read = reduce8(lo, hi);
        for (x, k) in row[body..].iter_mut().zip(&k[body..]) {
            *x *= decay;
            read = x.mul_add(*k, read);
        }
        let delta = (v - read) * beta;
        let deltas = vdupq_n_f32(delta);
        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        for ((x, k), q) in row[..body]
            .chunks_exact_mut(8)
            .zip(k.chunks_exact(8))
            .zip(q.chunks_exact(8))
        {
            // SAFETY: eight values each side.
            unsafe {
                let a = vfmaq_f32(vld1q_f32(x.as_ptr()), vld1q_f32(k.as_ptr()), deltas);
                let b = vfmaq_f32(
                    vld1q_f32(x.as_ptr().add(4)),
                    vld1q_f32(k.as_ptr().add(4)),
                    deltas,
                );
                vst1q_f32(x.as_mut_ptr(), a);
                vst1q_f32(x.as_mut_ptr().add(4), b);
                lo = vfmaq_f32(lo, a, vld1q_f32(q.as_ptr()));
                hi = vfmaq_f32(hi, b, vld1q_f32(q.as_ptr().add(4)));
            }
        }
        let mut read = reduce8(lo, hi);
        for ((x, k), q) in row[body..].iter_mut().zip(&k[body..]).zip(&q[body..]) {
            *x = k.mul_add(delta, *x);
            read = x.mul_add(*q, read);
        }
        *o = read * scale;
    }
}
