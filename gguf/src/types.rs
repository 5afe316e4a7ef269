//! ggml tensor types and their block layouts (ids from ggml's `ggml_type`).

/// A tensor's storage type; only types whose block layout is known are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorType {
    /// The ggml type id.
    pub id: u32,
    /// Its name, e.g. `Q4_K`.
    pub name: &'static str,
    /// Elements per block.
    pub block_elements: u64,
    /// Bytes per block.
    pub block_bytes: u64,
}

const TYPES: [(u32, &str, u64, u64); 22] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (20, "IQ4_NL", 32, 18),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (30, "BF16", 1, 2),
];

impl TensorType {
    /// The type with this id, if its layout is known.
    pub fn from_id(id: u32) -> Option<TensorType> {
        TYPES
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block_elements, block_bytes)| TensorType {
                id,
                name,
                block_elements,
                block_bytes,
            })
    }

    /// Bytes a row-major tensor of `elements` takes; `None` on overflow or a partial block.
    pub fn bytes_for(&self, first_dim: u64, elements: u64) -> Option<u64> {
        if !first_dim.is_multiple_of(self.block_elements) {
            return None;
        }
        (elements / self.block_elements).checked_mul(self.block_bytes)
    }
}
