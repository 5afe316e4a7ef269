//! K-quant blocks with rows in lanes, as the batched kernels of both ISAs read them
//! (`x86/k_wide.rs`: 16 rows a 512-bit register; `arm/k_lanes.rs`: 4 rows a 128-bit one).
//!
//! A tile block holds one weight block of `T` rows: each 4-value group of the block's 256
//! values (unsigned) as one `u32` per row, then the rows' sub-block scales, mins and block
//! scales. Lane `r` is row `r`; rows past a matrix's end stay zero and sum to zero.

use crate::quant::f16_at;

/// One weight block of `T` rows, row `r` in lane `r`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct KTile<const T: usize> {
    /// The 256 values in 64 groups of four consecutive ones, in the order the scalar reference
    /// pairs them with the activations.
    pub groups: [[u32; T]; 64],
    /// The scale of each sub-block (Q4_K: 8 of 32 values; Q6_K: 16 of 16).
    pub scales: [[i32; T]; 16],
    /// Q4_K's eight mins.
    pub mins: [[i32; T]; 8],
    /// Each row's block scale and, for Q4_K, its min scale.
    pub d: [f32; T],
    pub dmin: [f32; T],
}

impl<const T: usize> Default for KTile<T> {
    fn default() -> Self {
        KTile {
            groups: [[0; T]; 64],
            scales: [[0; T]; 16],
            mins: [[0; T]; 8],
            d: [0.0; T],
            dmin: [0.0; T],
        }
    }
}

/// A 4-byte little-endian word of `b` at `at`.
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<const T: usize> KTile<T> {
    /// Puts the Q4_K block `b` into lane `r`.
    pub fn put_q4_k(&mut self, r: usize, b: &[u8]) {
        let (sc, mins) = super::scalar::q4_k_scales(b);
        for (j, chunk) in b[16..144].chunks_exact(32).enumerate() {
            // Chunk j holds sub-block 2j in its low nibbles, 2j + 1 in its high ones.
            for (p, q) in chunk.chunks_exact(4).enumerate() {
                let raw = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
                self.groups[16 * j + p][r] = raw & 0x0f0f_0f0f;
                self.groups[16 * j + 8 + p][r] = (raw >> 4) & 0x0f0f_0f0f;
            }
        }
        for (s, scale) in sc.iter().enumerate() {
            self.scales[s][r] = i32::from(*scale);
            self.mins[s][r] = mins[s];
        }
        self.d[r] = f16_at(b, 0);
        self.dmin[r] = f16_at(b, 2);
    }

    /// Puts the Q6_K block `b` into lane `r` (its values unsigned, 0–63).
    pub fn put_q6_k(&mut self, r: usize, b: &[u8]) {
        let (ql, qh) = (&b[..128], &b[128..192]);
        for half in 0..2 {
            let (ql, qh) = (
                &ql[64 * half..64 * half + 64],
                &qh[32 * half..32 * half + 32],
            );
            for p in 0..8 {
                let at = 4 * p;
                let (l0, l1, h) = (word(ql, at), word(ql, 32 + at), word(qh, at));
                let high = |shift: u32| ((h >> shift) & 0x0303_0303) << 4;
                let base = 32 * half;
                self.groups[base + p][r] = (l0 & 0x0f0f_0f0f) | high(0);
                self.groups[base + 8 + p][r] = (l1 & 0x0f0f_0f0f) | high(2);
                self.groups[base + 16 + p][r] = ((l0 >> 4) & 0x0f0f_0f0f) | high(4);
                self.groups[base + 24 + p][r] = ((l1 >> 4) & 0x0f0f_0f0f) | high(6);
            }
        }
        for (g, scale) in self.scales.iter_mut().enumerate() {
            scale[r] = i32::from(b[192 + g] as i8);
        }
        self.d[r] = f16_at(b, 208);
    }
}
