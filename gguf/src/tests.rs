use crate::rewrite::{Edit, with_edits};
use crate::testfile::{Builder, sample};
use crate::{Header, Value, ValueType};

fn data(file: &[u8], header: &Header) -> Vec<u8> {
    file[header.data_start..].to_vec()
}

#[test]
fn parses_metadata_and_tensors() {
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    assert_eq!(h.version, 3);
    assert_eq!(
        h.get("general.architecture"),
        Some(&Value::String("llama".into()))
    );
    assert_eq!(
        h.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64),
        Some(2)
    );
    assert_eq!(
        h.get("tokenizer.ggml.tokens"),
        Some(&Value::Array {
            element: ValueType::String,
            len: 4
        })
    );
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[1].offset, 32);
    assert_eq!(h.data_start % 32, 0);
    let first = &file[h.data_start..h.data_start + 4];
    assert_eq!(
        f32::from_le_bytes([first[0], first[1], first[2], first[3]]),
        1.0
    );
}

#[test]
fn edits_rewrite_the_header_and_keep_tensor_data_identical_and_aligned() {
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    let template = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.content }}<end_of_turn>{% endfor %}";
    let edits = [
        Edit::Set(
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        ),
        Edit::Replace("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        Edit::Set("tokenizer.ggml.eot_token_id".into(), Value::U32(2)),
        Edit::Remove("general.architecture".into()),
    ];
    let mut out = with_edits(&file, &h, &edits).expect("rewrite");
    assert_eq!(out.len() % 32, 0);
    out.extend_from_slice(&data(&file, &h));
    let h2 = Header::parse(&out).expect("rewritten file parses");
    assert_eq!(
        h2.get("tokenizer.chat_template"),
        Some(&Value::String(template.into()))
    );
    assert_eq!(h2.get("tokenizer.ggml.eos_token_id"), Some(&Value::U32(1)));
    assert_eq!(h2.get("tokenizer.ggml.eot_token_id"), Some(&Value::U32(2)));
    assert_eq!(h2.get("general.architecture"), None);
    assert_eq!(
        h2.get("tokenizer.ggml.tokens"),
        h.get("tokenizer.ggml.tokens")
    );
    assert_eq!(data(&out, &h2), data(&file, &h));
    assert_eq!(
        h2.tensors
            .iter()
            .map(|t| (&t.name, t.offset))
            .collect::<Vec<_>>(),
        h.tensors
            .iter()
            .map(|t| (&t.name, t.offset))
            .collect::<Vec<_>>()
    );
}

#[test]
fn entries_copied_from_another_file_keep_their_arrays() {
    let donor = Builder::new()
        .strings("tokenizer.ggml.tokens", &["<|fim_prefix|>", "a", "b"])
        .u32("tokenizer.ggml.eos_token_id", 1)
        .build();
    let donor_header = Header::parse(&donor).expect("donor");
    let copy = |key: &str| {
        let kv = donor_header.entry(key).expect("donor key");
        Edit::Copy(key.into(), donor[kv.span.clone()].to_vec())
    };
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    let edits = [
        copy("tokenizer.ggml.tokens"),
        copy("tokenizer.ggml.eos_token_id"),
    ];
    let mut out = with_edits(&file, &h, &edits).expect("rewrite");
    out.extend_from_slice(&data(&file, &h));
    let h2 = Header::parse(&out).expect("rewritten file parses");
    let tokens = h2.entry("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(
        crate::arrays::strings(&out, tokens).expect("strings"),
        ["<|fim_prefix|>", "a", "b"]
    );
    assert_eq!(h2.get("tokenizer.ggml.eos_token_id"), Some(&Value::U32(1)));
    assert_eq!(data(&out, &h2), data(&file, &h));
    // An entry whose bytes name another key is refused.
    let kv = donor_header.entry("tokenizer.ggml.tokens").expect("tokens");
    let misnamed = Edit::Copy("general.name".into(), donor[kv.span.clone()].to_vec());
    assert!(with_edits(&file, &h, &[misnamed]).is_err());
}

#[test]
fn no_edits_reproduce_the_file_exactly() {
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    let mut out = with_edits(&file, &h, &[]).expect("rewrite");
    out.extend_from_slice(&data(&file, &h));
    assert_eq!(out, file);
}

#[test]
fn edits_that_cannot_apply_are_refused() {
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    for edit in [
        Edit::Replace("no.such.key".into(), Value::U32(1)),
        Edit::Remove("no.such.key".into()),
        Edit::Set("general.alignment".into(), Value::U32(64)),
        Edit::Set(
            "tokenizer.ggml.tokens".into(),
            Value::Array {
                element: ValueType::U8,
                len: 0,
            },
        ),
    ] {
        assert!(
            with_edits(&file, &h, std::slice::from_ref(&edit)).is_err(),
            "{edit:?}"
        );
    }
}

#[test]
fn hostile_headers_name_the_problem() {
    let good = sample();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GGML\x03\0\0\0".to_vec(), "magic"),
        (good[..good.len() - 10].to_vec(), "truncated"),
        (
            {
                let mut f = good.clone();
                f[4] = 1;
                f
            },
            "version 1",
        ),
        (
            {
                let mut f = good.clone();
                f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
                f
            },
            "tensor count",
        ),
        (
            {
                let mut f = good.clone();
                f[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
                f
            },
            "metadata count",
        ),
        (
            Builder::new().u32("general.alignment", 3).build(),
            "alignment",
        ),
        (Builder::new().u32("a", 1).u32("a", 2).build(), "twice"),
    ];
    for (file, expected) in cases {
        let err = Header::parse(&file).expect_err(expected);
        assert!(err.message.contains(expected), "{expected}: {err}");
    }
}

/// Deterministic mutation fuzzing: whatever the bytes, parsing returns (no panic, no huge
/// allocation), and whatever parses rewrites into a file that parses to the same tensors.
#[test]
fn fuzz_parse_and_rewrite_never_panic() {
    let seed = sample();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut parsed = 0;
    for _ in 0..30_000 {
        let mut file = seed.clone();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() as usize) % file.len();
            match next() % 4 {
                0 => file[at] = next() as u8,
                1 => file[at] ^= 1 << (next() % 8),
                2 => file.truncate(at.max(1)),
                _ => {
                    let end = (at + 8).min(file.len());
                    file[at..end].fill(0xff);
                }
            }
        }
        if let Ok(h) = Header::parse(&file) {
            parsed += 1;
            let edit = Edit::Set(
                "fuzz.key".into(),
                Value::String("x".repeat((next() % 100) as usize)),
            );
            let mut out = with_edits(&file, &h, &[edit]).expect("a parsed header can be rewritten");
            out.extend_from_slice(&file[h.data_start..]);
            let h2 = Header::parse(&out).expect("the rewrite parses");
            assert_eq!(h2.tensors.len(), h.tensors.len());
            assert_eq!(&out[h2.data_start..], &file[h.data_start..]);
        }
    }
    assert!(
        parsed > 100,
        "the mutations should leave many files valid, got {parsed}"
    );
}

#[test]
fn huge_counts_and_arrays_cost_only_what_the_file_holds() {
    // A header claiming 2^40 entries in a tiny file is refused before any reservation.
    let mut file = sample();
    file[8..16].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let err = Header::parse(&file).expect_err("too many tensors");
    assert!(err.message.contains("tensor count"), "{err}");
    // A large byte array is checked and skipped in one step, not element by element.
    let mut big = Builder::new().build();
    big.truncate(24);
    big[16..24].copy_from_slice(&1u64.to_le_bytes());
    let key = b"blob";
    big.extend_from_slice(&(key.len() as u64).to_le_bytes());
    big.extend_from_slice(key);
    big.extend_from_slice(&9u32.to_le_bytes());
    big.extend_from_slice(&0u32.to_le_bytes());
    let n = 64u64 << 20;
    big.extend_from_slice(&n.to_le_bytes());
    big.resize(big.len() + n as usize + 32, 7);
    let h = Header::parse(&big).expect("parses");
    assert_eq!(
        h.get("blob"),
        Some(&Value::Array {
            element: ValueType::U8,
            len: n
        })
    );
    // One byte short: the array no longer fits, and the error names the key.
    big.truncate(24 + 8 + key.len() + 4 + 4 + 8 + n as usize - 1);
    let err = Header::parse(&big).expect_err("short");
    assert!(err.message.contains("blob"), "{err}");
}

#[test]
fn arrays_are_read_on_demand_and_type_checked() {
    let file = sample();
    let h = Header::parse(&file).expect("parse");
    let tokens = h.entry("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(
        crate::arrays::strings(&file, tokens).expect("strings"),
        vec!["<s>", "</s>", "<eot>", "hi"]
    );
    assert!(crate::arrays::f32s(&file, tokens).is_err());
    let scalar = h.entry("tokenizer.ggml.eos_token_id").expect("eos");
    assert!(crate::arrays::strings(&file, scalar).is_err());
}

#[test]
fn per_layer_arrays_read_as_counts_and_bools() {
    let file = Builder::new()
        .u32s("a.ff", &[512, 1024])
        .i32s("a.heads", &[8, 4])
        .i32s("a.bad", &[3, -1])
        .bools("a.swa", &[true, false, true])
        .f32s("a.floats", &[1.0])
        .build();
    let header = Header::parse(&file).expect("parse");
    let entry = |k: &str| header.entry(k).expect(k);
    assert_eq!(
        crate::arrays::counts(&file, entry("a.ff")).expect("u32"),
        [512, 1024]
    );
    assert_eq!(
        crate::arrays::counts(&file, entry("a.heads")).expect("i32"),
        [8, 4]
    );
    let negative = crate::arrays::counts(&file, entry("a.bad")).expect_err("negative");
    assert!(negative.to_string().contains("negative"), "{negative}");
    assert!(crate::arrays::counts(&file, entry("a.floats")).is_err());
    assert_eq!(
        crate::arrays::bools(&file, entry("a.swa")).expect("bools"),
        [true, false, true]
    );
    assert!(crate::arrays::bools(&file, entry("a.ff")).is_err());
    // A bool byte other than 0 or 1 is refused, not read as true.
    let mut bent = file.clone();
    let at = entry("a.swa").span.end - 1;
    bent[at] = 7;
    let header = Header::parse(&bent);
    if let Ok(header) = header {
        let swa = header.entry("a.swa").expect("a.swa");
        assert!(crate::arrays::bools(&bent, swa).is_err());
    }
}
