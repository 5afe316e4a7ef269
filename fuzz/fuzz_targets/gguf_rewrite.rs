//! Any bytes: the GGUF header parser returns an error or a header; a header always rewrites
//! into a file that parses again with the same tensors and byte-identical tensor data.
#![no_main]

use gguf::rewrite::{Edit, with_edits};
use gguf::{Header, Value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = Header::parse(data) else {
        return;
    };
    let edit = Edit::Set("fuzz.key".into(), Value::String("value".into()));
    let mut out = with_edits(data, &header, &[edit]).expect("a parsed header rewrites");
    out.extend_from_slice(&data[header.data_start..]);
    let again = Header::parse(&out).expect("the rewrite parses");
    assert_eq!(again.tensors.len(), header.tensors.len());
    assert_eq!(&out[again.data_start..], &data[header.data_start..]);
});
