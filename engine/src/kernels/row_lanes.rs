//! Q4_K and Q6_K matrices copied once at load with sixteen rows side by side, so a register
//! holds one 32-bit lane per row and a product needs no horizontal sums.
//!
//! In the stored layout every (row, block) of a token's product ends in folds across lanes and
//! scale unpacking of its own: on Gemma 4 E2B's shapes that compute, not memory, bounded
//! generation (the kernel streamed 16 GB/s of a core's 32). Here a block of sixteen rows is
//! stored field by field, each field's units (f16, 32-bit word or byte) of the sixteen rows
//! next to each other: a load gives sixteen rows' four values, one `vpdpbusd` with the
//! activations' four broadcast adds their products into each row's lane, and each row's
//! scales sit in its own lane to multiply. The bytes are the stored ones rearranged (same
//! size), the integer sums are exact and every float step is the reference's, so results keep
//! the reference's bits. A copy replaces the mapped rows for every product on x86; the other
//! instruction sets read the stored rows.

/// Rows side by side.
pub const ROWS: usize = 16;

/// The K-quant types this layout holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneKind {
    /// Q4_K: `d`, `dmin` (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
    Q4K,
    /// Q6_K: 128 bytes of low nibbles, 64 of high bits, 16 signed scales, `d` (f16).
    Q6K,
}

impl LaneKind {
    /// The kind of a tensor type's name, if it has this layout.
    pub fn of(type_name: &str) -> Option<LaneKind> {
        match type_name {
            "Q4_K" => Some(LaneKind::Q4K),
            "Q6_K" => Some(LaneKind::Q6K),
            _ => None,
        }
    }

    /// Bytes of one row's block.
    pub fn block_bytes(self) -> usize {
        match self {
            LaneKind::Q4K => 144,
            LaneKind::Q6K => 210,
        }
    }

    /// The block's fields in the copy's order, as (offset in the stored block, bytes, unit):
    /// together they cover the block once. Q4_K keeps the stored order. Q6_K's words go in the
    /// order its kernel reads them, so the copy streams: for each half of the block and each
    /// word `k` of its eight, low-nibble words `k` and `8 + k`, then high-bit word `k`.
    fn fields(self) -> Vec<(usize, usize, usize)> {
        match self {
            LaneKind::Q4K => vec![(0, 2, 2), (2, 2, 2), (4, 12, 4), (16, 128, 4)],
            LaneKind::Q6K => {
                let mut fields = Vec::with_capacity(50);
                for half in 0..2 {
                    for k in 0..8 {
                        let low = 64 * half + 4 * k;
                        fields.extend([
                            (low, 4, 4),
                            (low + 32, 4, 4),
                            (128 + 32 * half + 4 * k, 4, 4),
                        ]);
                    }
                }
                fields.extend([(192, 16, 1), (208, 2, 2)]);
                fields
            }
        }
    }
}

/// The lanes copy of `rows` (whole rows of `row_bytes` bytes, their count a multiple of
/// [`ROWS`]): group `g` of sixteen rows at `g · 16 · row_bytes`, in it block `i` at
/// `i · 16 · block`, in it field by field (each taking 16 times its bytes) unit `u` of row `r`
/// at `(u · 16 + r) · unit`, in anonymous memory. None if the rows do not divide so or the
/// system has no memory to map (then the stored rows serve).
pub fn interleave(kind: LaneKind, rows: &[u8], row_bytes: usize) -> Option<memmap2::MmapMut> {
    let block = kind.block_bytes();
    if row_bytes == 0
        || !row_bytes.is_multiple_of(block)
        || !rows.len().is_multiple_of(ROWS * row_bytes)
    {
        return None;
    }
    let mut out = memmap2::MmapMut::map_anon(rows.len()).ok()?;
    // Generation streams the whole copy each token: huge pages spare a page walk every 4 KiB
    // (about 3 % at one thread on Qwen 3.5 4B's shapes). Only a hint; without it, small pages.
    let _ = out.advise(memmap2::Advice::HugePage);
    let fields = kind.fields();
    let group_bytes = ROWS * row_bytes;
    for (from, to) in rows
        .chunks_exact(group_bytes)
        .zip(out.chunks_exact_mut(group_bytes))
    {
        for i in 0..row_bytes / block {
            let to = &mut to[i * ROWS * block..(i + 1) * ROWS * block];
            let mut at = 0;
            for &(offset, len, unit) in &fields {
                for r in 0..ROWS {
                    let src = &from[r * row_bytes + i * block + offset..][..len];
                    for (u, value) in src.chunks_exact(unit).enumerate() {
                        let dst = at + (u * ROWS + r) * unit;
                        match unit {
                            // Fixed sizes: a copy of a few bytes not made a library call.
                            4 => to[dst..dst + 4].copy_from_slice(&value[..4]),
                            2 => to[dst..dst + 2].copy_from_slice(&value[..2]),
                            _ => to[dst] = value[0],
                        }
                    }
                }
                at += ROWS * len;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_lands_once_where_the_layout_says() {
        // Each byte names its row and offset, so the copy is a permutation to check.
        for kind in [LaneKind::Q4K, LaneKind::Q6K] {
            let block = kind.block_bytes();
            let row_bytes = 2 * block;
            let rows: Vec<u8> = (0..2 * ROWS * row_bytes)
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let lanes = interleave(kind, &rows, row_bytes).expect("whole groups");
            let mut sorted_in = rows.clone();
            let mut sorted_out = lanes.to_vec();
            sorted_in.sort_unstable();
            sorted_out.sort_unstable();
            assert_eq!(sorted_in, sorted_out);
            // Row 5 of the second group, block 1: its first f16 or word.
            let (g, r, i) = (1, 5, 1);
            let stored = &rows[(g * ROWS + r) * row_bytes + i * block..][..2];
            let first_unit = kind.fields()[0].2;
            let at = g * ROWS * row_bytes + i * ROWS * block + r * first_unit;
            assert_eq!(&lanes[at..at + 2], stored, "{kind:?}");
        }
        assert!(interleave(LaneKind::Q4K, &[0; 144 * 15], 144).is_none());
    }
}
