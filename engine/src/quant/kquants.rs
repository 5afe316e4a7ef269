//! 256-element "K" super-blocks.
//!
//! Q4_K / Q5_K: f16 d, f16 dmin, 12 bytes packing eight 6-bit scales and mins, (Q5_K: 32 bytes of
//! fifth bits,) 128 bytes of nibbles; each 32-element sub-block is x = d·scale·q − dmin·min.
//! Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, sixteen i8 scales, f16 d; each
//! 16-element group is x = d·scale·(q − 32).

use super::f16_at;

/// The effective scales and mins of the two 32-element sub-blocks of `pair` (0–3).
fn pair_scales(d: f32, dmin: f32, packed: &[u8], pair: usize) -> [(f32, f32); 2] {
    [2 * pair, 2 * pair + 1].map(|j| {
        let (sc, m) = scale_min(j, packed);
        (d * f32::from(sc), dmin * f32::from(m))
    })
}

/// The 6-bit scale and min of sub-block `j` (0–7) from the 12 packed bytes.
pub(crate) fn scale_min(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

pub fn q4_k(raw: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(raw, 0), f16_at(raw, 2));
    let packed = &raw[4..16];
    let qs = &raw[16..144];
    for pair in 0..4 {
        let q = &qs[32 * pair..32 * pair + 32];
        let [(d1, min1), (d2, min2)] = pair_scales(d, dmin, packed, pair);
        let y = &mut out[64 * pair..64 * pair + 64];
        for l in 0..32 {
            y[l] = d1 * f32::from(q[l] & 0x0f) - min1;
            y[l + 32] = d2 * f32::from(q[l] >> 4) - min2;
        }
    }
}

pub fn q5_k(raw: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(raw, 0), f16_at(raw, 2));
    let packed = &raw[4..16];
    let qh = &raw[16..48];
    let ql = &raw[48..176];
    for pair in 0..4 {
        let q = &ql[32 * pair..32 * pair + 32];
        let (u1, u2) = (1u8 << (2 * pair), 2u8 << (2 * pair));
        let [(d1, min1), (d2, min2)] = pair_scales(d, dmin, packed, pair);
        let y = &mut out[64 * pair..64 * pair + 64];
        for l in 0..32 {
            let hi1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * f32::from((q[l] & 0x0f) + hi1) - min1;
            y[l + 32] = d2 * f32::from((q[l] >> 4) + hi2) - min2;
        }
    }
}

pub fn q6_k(raw: &[u8], out: &mut [f32]) {
    let d = f16_at(raw, 208);
    for half in 0..2 {
        let ql = &raw[64 * half..64 * half + 64];
        let qh = &raw[128 + 32 * half..128 + 32 * half + 32];
        let sc = &raw[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            let scale = |k: usize| d * f32::from(sc[k] as i8);
            y[l] = scale(is) * q1 as f32;
            y[l + 32] = scale(is + 2) * q2 as f32;
            y[l + 64] = scale(is + 4) * q3 as f32;
            y[l + 96] = scale(is + 6) * q4 as f32;
        }
    }
}
