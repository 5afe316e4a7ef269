//! The scalar reference against llama.cpp's own dequantization (gguf-py), on real blocks of the
//! default models and on generated ones (`tests/data/make-quant-goldens.py` writes the file).

use engine::quant::{TensorType, dequantize, dot};
use serde_json::Value;

fn goldens() -> Vec<(TensorType, Vec<u8>, Vec<f32>)> {
    let text = include_str!("data/quant-goldens.json");
    let entries: Vec<Value> = serde_json::from_str(text).expect("golden JSON");
    entries
        .iter()
        .map(|e| {
            let id = e["id"].as_u64().expect("id") as u32;
            let ty = TensorType::from_id(id).unwrap_or_else(|| panic!("type {id} unknown"));
            assert_eq!(ty.name, e["type"].as_str().expect("name"));
            let hex = e["bytes"].as_str().expect("bytes");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            let values = e["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v.as_f64().expect("f") as f32)
                .collect();
            (ty, bytes, values)
        })
        .collect()
}

fn close(ours: f32, theirs: f32) -> bool {
    (ours - theirs).abs() <= 1e-6 * theirs.abs().max(1.0)
}

#[test]
fn every_type_dequantizes_like_llama_cpp() {
    let all = goldens();
    let names: Vec<&str> = all.iter().map(|(t, _, _)| t.name).collect();
    for required in [
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
        "IQ4_NL",
    ] {
        assert!(names.contains(&required), "no golden for {required}");
    }
    for (ty, bytes, expected) in all {
        let mut ours = vec![0f32; expected.len()];
        dequantize(&ty, &bytes, &mut ours).expect("dequantize");
        for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
            assert!(
                close(*a, *b),
                "{} element {i}: ours {a}, llama.cpp {b}",
                ty.name
            );
        }
    }
}

#[test]
fn dot_is_the_sum_of_products_of_the_dequantized_row() {
    for (ty, bytes, expected) in goldens() {
        let x: Vec<f32> = (0..expected.len())
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let exact: f64 = expected
            .iter()
            .zip(&x)
            .map(|(w, v)| f64::from(*w) * f64::from(*v))
            .sum();
        let scale: f64 = expected
            .iter()
            .zip(&x)
            .map(|(w, v)| (f64::from(*w) * f64::from(*v)).abs())
            .sum();
        let ours = f64::from(dot(&ty, &bytes, &x).expect("dot"));
        assert!(
            (ours - exact).abs() <= 1e-5 * scale.max(1e-6),
            "{}: {ours} vs {exact}",
            ty.name
        );
    }
}

#[test]
fn partial_blocks_and_unsupported_types_are_errors() {
    let q4_0 = TensorType::from_id(2).expect("Q4_0");
    let mut out = vec![0f32; 32];
    assert!(dequantize(&q4_0, &[0u8; 17], &mut out).is_err());
    assert!(dequantize(&q4_0, &[0u8; 18], &mut out[..31]).is_err());
    assert!(dot(&q4_0, &[0u8; 18], &[0f32; 16]).is_err());
    let q2_k = TensorType::from_id(10).expect("Q2_K");
    assert!(dequantize(&q2_k, &[0u8; 84], &mut vec![0f32; 256]).is_err());
}
