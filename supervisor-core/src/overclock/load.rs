//! The all-core compute load whose every result is checked against answers computed once, on a
//! known-good machine, and written down here. A clock that is too high rarely crashes at once;
//! it flips a bit in a multiply or a load, and that shows up as a wrong answer.
//!
//! One unit of work mixes what inference leans on: a buffer larger than a core's L2 filled by
//! an integer generator and hashed (memory, integer and the SHA instructions), and a long chain
//! of correctly rounded f64 multiply, add and square root (the FP pipeline), whose result is
//! the same bit for bit on every IEEE machine.

use sha2::{Digest, Sha256};

/// Words of the buffer one unit hashes (1 MiB).
const BUFFER_WORDS: usize = 128 * 1024;
/// Steps of the floating-point chain.
const FP_STEPS: u32 = 100_000;

/// The answer of every unit, from `unit_answer(k, 0)` on a known-good machine (the test
/// `answers_are_what_a_correct_machine_computes` recomputes them).
pub const ANSWERS: [u64; 8] = [
    0xf8ed_0bec_86ae_660b,
    0x971a_e74b_49c0_c095,
    0xb06e_726d_113c_8c9b,
    0x8b44_5263_1248_8be4,
    0xddc6_73f9_d5e9_3bdb,
    0xe66e_7a3b_7a27_ebfe,
    0xb436_0d29_423a_89c7,
    0xcc73_96a3_9b0e_ae9f,
];

/// Unit `k`'s result; `corruption` is XORed into the buffer as a faulty core would flip bits.
pub fn unit_answer(k: usize, corruption: u64) -> u64 {
    let mut state = (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut buffer = vec![0u64; BUFFER_WORDS];
    for word in buffer.iter_mut() {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        *word = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
    }
    if let Some(last) = buffer.last_mut() {
        *last ^= corruption;
    }
    let mut hasher = Sha256::new();
    for word in &buffer {
        hasher.update(word.to_le_bytes());
    }
    let digest = hasher.finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let mut x = 1.0 + k as f64 / 8.0;
    for i in 0..FP_STEPS {
        x = (x * 1.000_001 + f64::from(i % 7)).sqrt() + 0.25;
    }
    u64::from_le_bytes(head) ^ x.to_bits().rotate_left(17)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_what_a_correct_machine_computes() {
        let computed: Vec<u64> = (0..ANSWERS.len()).map(|k| unit_answer(k, 0)).collect();
        assert_eq!(computed, ANSWERS, "computed {computed:#x?}");
    }

    #[test]
    fn a_flipped_bit_changes_the_answer() {
        assert_ne!(unit_answer(3, 1 << 12), ANSWERS[3]);
    }
}
