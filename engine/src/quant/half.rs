//! Half-precision conversions (IEEE binary16 and bfloat16), exact for every input.

/// IEEE 754 binary16 to f32, including subnormals, infinities and NaN.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        // Subnormal: value = mantissa × 2^-24; normalise it into an f32 exponent.
        (0, m) => {
            let shift = m.leading_zeros() - 21; // bring the top set bit to bit 10
            let normalized = (m << shift) & 0x3ff;
            let exp = 127 - 15 + 1 - shift;
            (exp << 23) | (normalized << 13)
        }
        (0x1f, 0) => 0x7f80_0000,
        (0x1f, m) => 0x7fc0_0000 | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// f32 to IEEE binary16, rounding to nearest with ties to even (as F16C's `vcvtps2ph` and
/// ggml do); overflow gives ±infinity and NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        let nan = if mantissa != 0 { 0x200 } else { 0 };
        return sign | 0x7c00 | nan;
    }
    // binary16 exponent of a normal result; at or below zero the result is subnormal.
    let e = exponent - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let (kept, shift) = if e > 0 {
        ((e as u32) << 10 | (mantissa >> 13), 13)
    } else {
        // Subnormal: the implicit bit joins the mantissa, shifted to units of 2^-24.
        let shift = (14 - e) as u32;
        if exponent == 0 || shift > 24 {
            return sign;
        }
        ((mantissa | 0x80_0000) >> shift, shift)
    };
    let full = if e > 0 {
        mantissa
    } else {
        mantissa | 0x80_0000
    };
    let rest = full & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    // A carry out of the mantissa correctly bumps the exponent (up to infinity).
    let rounded = if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    };
    sign | rounded as u16
}

/// bfloat16 to f32: the upper half of an f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_and_boundary_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn every_finite_f16_round_trips_through_its_definition() {
        for bits in 0..=u16::MAX {
            let e = (bits >> 10) & 0x1f;
            if e == 0x1f {
                continue;
            }
            let m = f64::from(bits & 0x3ff);
            let magnitude = if e == 0 {
                m * 2f64.powi(-24)
            } else {
                (1.0 + m / 1024.0) * 2f64.powi(i32::from(e) - 15)
            };
            let expected = if bits & 0x8000 != 0 {
                -magnitude
            } else {
                magnitude
            };
            assert_eq!(f64::from(f16_to_f32(bits)), expected, "{bits:#06x}");
        }
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        for bits in 0..0x7bffu16 {
            let value = f16_to_f32(bits);
            assert_eq!(f32_to_f16(value), bits, "{bits:#06x} round trip");
            assert_eq!(f32_to_f16(-value), bits | 0x8000, "-{bits:#06x} round trip");
            // Between this value and the next: the midpoint goes to the even one, anything
            // nearer to either side goes there.
            let next = f16_to_f32(bits + 1);
            let mid = ((f64::from(value) + f64::from(next)) / 2.0) as f32;
            let even = if bits % 2 == 0 { bits } else { bits + 1 };
            assert_eq!(f32_to_f16(mid), even, "midpoint above {bits:#06x}");
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() - 1)), bits);
            assert_eq!(f32_to_f16(f32::from_bits(mid.to_bits() + 1)), bits + 1);
        }
        assert_eq!(
            f32_to_f16(65520.0),
            0x7c00,
            "rounds past the largest finite value"
        );
        assert_eq!(f32_to_f16(1e-10), 0);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }
}
