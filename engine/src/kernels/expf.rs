//! e^x for attention's softmax, rounded as glibc's `expf` rounds it on x86-64 (checked over
//! every f32 from −104 to 88.7; on aarch64 glibc it differs at one input), written out so the
//! SIMD paths can compute eight (or four) at once with the same bits. The reference's
//! softmax called libm `expf` once per head and row, about a fifth of a wide pass's attention.
//! It is not `scalar::expf_poly`, the SiLU's exponential: each follows what llama.cpp runs in
//! that place (libm in flash attention, ggml's vector polynomial in SiLU), and they round
//! differently.
//!
//! The method (glibc's, after Szabolcs Nagy's): `x·32/ln2 = k + r`, `e^x = 2^(k/32)·2^(r/32)`
//! with `2^(k/32)` from a 32-entry table and `2^(r/32)` by a degree-3 polynomial, all in f64
//! with fused multiply-adds, rounded once to f32 at the end.

/// `2^(i/32)` as an f64's bits, minus `i << 47` (the exponent bits `k` adds back).
pub const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32/ln2`.
pub const INV_LN2_32: f64 = f64::from_bits(0x3ff71547652b82fe) * 32.0;

/// `1.5·2^52`: added to a value below 2^51 in magnitude, it rounds it to an integer (ties to
/// even), which then sits in the low bits.
pub const SHIFT: f64 = f64::from_bits(0x4338000000000000);

/// The polynomial `2^(r/32) ≈ (C[0]·r + C[1])·r² + C[2]·r + 1`.
pub const C: [f64; 3] = [
    f64::from_bits(0x3fac6af84b912394) / 32.0 / 32.0 / 32.0,
    f64::from_bits(0x3fcebfce50fac4f3) / 32.0 / 32.0,
    f64::from_bits(0x3fe62e42ff0c52d6) / 32.0,
];

/// Below this, e^x rounds to 0 (−inf included).
pub const LOWEST: f32 = f32::from_bits(0xc2cf_f1b4); // −0x1.9fe368p6, about −103.97

/// Above this, e^x overflows to infinity.
pub const HIGHEST: f32 = f32::from_bits(0x42b1_7217); // 0x1.62e42ep6, about 88.72

/// e^x as glibc's `expf` (see the module's notes); NaN gives NaN.
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x + x;
    }
    if x < LOWEST {
        return 0.0;
    }
    if x > HIGHEST {
        return f32::INFINITY;
    }
    let xd = f64::from(x);
    let shifted = xd.mul_add(INV_LN2_32, SHIFT);
    let k = shifted.to_bits();
    let r = xd.mul_add(INV_LN2_32, -(shifted - SHIFT));
    let s = f64::from_bits(TABLE[(k % 32) as usize].wrapping_add(k << 47));
    let high = C[0].mul_add(r, C[1]);
    let low = C[2].mul_add(r, 1.0);
    (high.mul_add(r * r, low) * s) as f32
}

/// `x ← e^x` for each value.
pub fn expf_all(xs: &mut [f32]) {
    for x in xs {
        *x = expf(*x);
    }
}

/// Asserts that `simd` (a path computing `lanes` values at a time) gives [`expf_all`]'s bits
/// across the ranges attention sees (down to −inf) and past both ends, with a NaN in every lane
/// position.
#[cfg(test)]
pub fn assert_lanes_equal_the_scalar_routine(lanes: usize, simd: impl Fn(&mut [f32])) {
    let mut xs: Vec<f32> = (0..200_000u32)
        .map(|i| f32::from_bits(0xc2d0_0000u32.wrapping_sub(i.wrapping_mul(21_473))))
        .chain((-1200..1000).map(|i| i as f32 / 10.0))
        .chain([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -0.0,
            0.0,
            -103.97,
            88.72,
        ])
        .collect();
    xs.extend(
        (0..lanes)
            .flat_map(|lead| (0..lanes).map(move |l| if l == lead { f32::NAN } else { -1.0 })),
    );
    let (mut got, mut want) = (xs.clone(), xs.clone());
    simd(&mut got);
    expf_all(&mut want);
    for (x, (got, want)) in xs.iter().zip(got.iter().zip(&want)) {
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "e^{x}: {got} against {want}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 211th f32 from the lowest to the highest (about 10 million), each against libm's
    /// `expf` where it is glibc's x86-64 one, else within one ulp of the f64 exponential.
    #[test]
    fn rounds_as_glibc_expf() {
        let exact_libm = cfg!(all(target_arch = "x86_64", target_env = "gnu"));
        let mut bits = LOWEST.to_bits();
        let mut checked = 0;
        let mut check = |x: f32| {
            let got = expf(x);
            if exact_libm {
                assert_eq!(got.to_bits(), x.exp().to_bits(), "e^{x}");
            } else {
                let want = f64::from(x).exp();
                let ulp = f64::from(f32::EPSILON) * want.max(f64::from(f32::MIN_POSITIVE));
                assert!((f64::from(got) - want).abs() <= ulp, "e^{x}: {got}");
            }
            checked += 1;
        };
        // The negative floats, from LOWEST down in bits towards −0, then the positive ones.
        while bits > 0x8000_0000 {
            check(f32::from_bits(bits));
            bits = bits.saturating_sub(211).max(0x8000_0000);
        }
        let mut x = 0.0f32;
        while x <= HIGHEST {
            check(x);
            x = f32::from_bits(x.to_bits() + 211);
        }
        assert!(checked > 9_000_000, "{checked}");
    }

    #[test]
    fn saturates_and_keeps_nan() {
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(f32::INFINITY), f32::INFINITY);
        assert_eq!(expf(100.0), f32::INFINITY);
        assert!(expf(f32::NAN).is_nan());
        // The last finite result and the smallest non-zero one.
        assert!(expf(HIGHEST).is_finite());
        assert!(expf(LOWEST) > 0.0);
    }
}
