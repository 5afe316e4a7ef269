//! The Gated DeltaNet state step (`scalar::delta_step`) with AVX2 and FMA: eight lanes of
//! fused multiply-adds in one register, summed as `scalar::reduce8` sums them, the tail as the
//! reference takes it; the AVX-512 path uses it too, so every x86 path gives the same bits.

use std::arch::x86_64::*;

/// See `scalar::delta_step`; the caller checked AVX2 and FMA.
pub fn delta_step(
    s: &mut [f32],
    qkv: (&[f32], &[f32], &[f32]),
    gates: (f32, f32, f32),
    out: &mut [f32],
) {
    // SAFETY: `super::supported()` was checked by the dispatcher.
    unsafe { delta_step_avx2(s, qkv, gates, out) }
}

/// `scalar::reduce8` of a register's lanes.
#[target_feature(enable = "avx2,fma")]
fn reduce8(acc: __m256) -> f32 {
    let quads = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let pairs = _mm_add_ps(quads, _mm_movehl_ps(quads, quads));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps::<0b01>(pairs, pairs)))
}

#[target_feature(enable = "avx2,fma")]
fn delta_step_avx2(
    s: &mut [f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    (decay, beta, scale): (f32, f32, f32),
    out: &mut [f32],
) {
    let width = k.len();
    let body = width / 8 * 8;
    let decays = _mm256_set1_ps(decay);
    for ((row, &v), o) in s.chunks_exact_mut(width).zip(v).zip(out) {
        let mut acc = _mm256_setzero_ps();
        for (x, k) in row[..body].chunks_exact_mut(8).zip(k.chunks_exact(8)) {
            // SAFETY: eight values each side.
            unsafe {
                let decayed = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), decays);
                _mm256_storeu_ps(x.as_mut_ptr(), decayed);
                acc = _mm256_fmadd_ps(decayed, _mm256_loadu_ps(k.as_ptr()), acc);
            }
        }
        let mut read = reduce8(acc);
        for (x, k) in row[body..].iter_mut().zip(&k[body..]) {
            *x *= decay;
            read = x.mul_add(*k, read);
        }
        let delta = (v - read) * beta;
        let deltas = _mm256_set1_ps(delta);
        let mut acc = _mm256_setzero_ps();
        for ((x, k), q) in row[..body]
            .chunks_exact_mut(8)
            .zip(k.chunks_exact(8))
            .zip(q.chunks_exact(8))
        {
            // SAFETY: eight values each side.
            unsafe {
                let written = _mm256_fmadd_ps(
                    _mm256_loadu_ps(k.as_ptr()),
                    deltas,
                    _mm256_loadu_ps(x.as_ptr()),
                );
                _mm256_storeu_ps(x.as_mut_ptr(), written);
                acc = _mm256_fmadd_ps(written, _mm256_loadu_ps(q.as_ptr()), acc);
            }
        }
        let mut read = reduce8(acc);
        for ((x, k), q) in row[body..].iter_mut().zip(&k[body..]).zip(&q[body..]) {
            *x = k.mul_add(delta, *x);
            read = x.mul_add(*q, read);
        }
        *o = read * scale;
    }
}
