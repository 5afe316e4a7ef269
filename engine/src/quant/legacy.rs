//! 32-element block formats (ggml's "legacy" quants) and plain floats.
//!
//! Q4_0: f16 d, 16 bytes of nibbles; x = (q - 8)·d. Q4_1: f16 d, f16 m, nibbles; x = q·d + m.
//! Q5_0/Q5_1: as Q4 with a fifth bit per element from a 32-bit `qh`; Q5_0 centres at 16.
//! Q8_0: f16 d, 32 i8; x = q·d. IQ4_NL: f16 d, nibbles indexing a non-linear table.
//! Low nibbles hold elements 0–15, high nibbles 16–31.

use super::{bf16_to_f32, f16_at};

pub fn f32_block(raw: &[u8], out: &mut [f32]) {
    out[0] = f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
}

pub fn f16_block(raw: &[u8], out: &mut [f32]) {
    out[0] = f16_at(raw, 0);
}

pub fn bf16_block(raw: &[u8], out: &mut [f32]) {
    out[0] = bf16_to_f32(u16::from_le_bytes([raw[0], raw[1]]));
}

pub fn q4_0(raw: &[u8], out: &mut [f32]) {
    let d = f16_at(raw, 0);
    for (j, &q) in raw[2..18].iter().enumerate() {
        out[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
        out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

pub fn q4_1(raw: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(raw, 0), f16_at(raw, 2));
    for (j, &q) in raw[4..20].iter().enumerate() {
        out[j] = f32::from(q & 0x0f) * d + m;
        out[j + 16] = f32::from(q >> 4) * d + m;
    }
}

fn fifth_bits(raw: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]])
}

pub fn q5_0(raw: &[u8], out: &mut [f32]) {
    let d = f16_at(raw, 0);
    let qh = fifth_bits(raw, 2);
    for (j, &q) in raw[6..22].iter().enumerate() {
        let lo = u32::from(q & 0x0f) | (((qh >> j) & 1) << 4);
        let hi = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = (lo as i32 - 16) as f32 * d;
        out[j + 16] = (hi as i32 - 16) as f32 * d;
    }
}

pub fn q5_1(raw: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(raw, 0), f16_at(raw, 2));
    let qh = fifth_bits(raw, 4);
    for (j, &q) in raw[8..24].iter().enumerate() {
        let lo = u32::from(q & 0x0f) | (((qh >> j) & 1) << 4);
        let hi = u32::from(q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        out[j] = lo as f32 * d + m;
        out[j + 16] = hi as f32 * d + m;
    }
}

pub fn q8_0(raw: &[u8], out: &mut [f32]) {
    let d = f16_at(raw, 0);
    for (o, &q) in out.iter_mut().zip(&raw[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// IQ4_NL's 16 levels.
pub(crate) const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub fn iq4_nl(raw: &[u8], out: &mut [f32]) {
    let d = f16_at(raw, 0);
    for (j, &q) in raw[2..18].iter().enumerate() {
        out[j] = d * f32::from(IQ4_NL_LEVELS[usize::from(q & 0x0f)]);
        out[j + 16] = d * f32::from(IQ4_NL_LEVELS[usize::from(q >> 4)]);
    }
}
