//! Small GGUF files built byte by byte for tests (independent of the reader under test);
//! other crates' tests get it with the `testing` feature.

/// Builds a GGUF file in memory.
pub struct Builder {
    kvs: Vec<u8>,
    kv_count: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    /// Data alignment.
    pub alignment: u64,
}

impl Builder {
    /// An empty file.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Builder {
        Builder {
            kvs: Vec::new(),
            kv_count: 0,
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    fn key(&mut self, key: &str, tag: u32) {
        self.kvs
            .extend_from_slice(&(key.len() as u64).to_le_bytes());
        self.kvs.extend_from_slice(key.as_bytes());
        self.kvs.extend_from_slice(&tag.to_le_bytes());
        self.kv_count += 1;
    }

    /// A u32 key.
    pub fn u32(mut self, key: &str, v: u32) -> Builder {
        self.key(key, 4);
        self.kvs.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An f32 key.
    pub fn f32(mut self, key: &str, v: f32) -> Builder {
        self.key(key, 6);
        self.kvs.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A string key.
    pub fn string(mut self, key: &str, v: &str) -> Builder {
        self.key(key, 8);
        self.kvs.extend_from_slice(&(v.len() as u64).to_le_bytes());
        self.kvs.extend_from_slice(v.as_bytes());
        self
    }

    /// A string-array key.
    pub fn strings(mut self, key: &str, items: &[&str]) -> Builder {
        self.key(key, 9);
        self.kvs.extend_from_slice(&8u32.to_le_bytes());
        self.kvs
            .extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            self.kvs.extend_from_slice(&(s.len() as u64).to_le_bytes());
            self.kvs.extend_from_slice(s.as_bytes());
        }
        self
    }

    /// An f32-array key.
    pub fn f32s(mut self, key: &str, items: &[f32]) -> Builder {
        self.key(key, 9);
        self.kvs.extend_from_slice(&6u32.to_le_bytes());
        self.kvs
            .extend_from_slice(&(items.len() as u64).to_le_bytes());
        for v in items {
            self.kvs.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// A u32-array key.
    pub fn u32s(mut self, key: &str, items: &[u32]) -> Builder {
        self.key(key, 9);
        self.kvs.extend_from_slice(&4u32.to_le_bytes());
        self.kvs
            .extend_from_slice(&(items.len() as u64).to_le_bytes());
        for v in items {
            self.kvs.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// A bool-array key.
    pub fn bools(mut self, key: &str, items: &[bool]) -> Builder {
        self.key(key, 9);
        self.kvs.extend_from_slice(&7u32.to_le_bytes());
        self.kvs
            .extend_from_slice(&(items.len() as u64).to_le_bytes());
        self.kvs.extend(items.iter().map(|&b| u8::from(b)));
        self
    }

    /// An i32-array key.
    pub fn i32s(mut self, key: &str, items: &[i32]) -> Builder {
        self.key(key, 9);
        self.kvs.extend_from_slice(&5u32.to_le_bytes());
        self.kvs
            .extend_from_slice(&(items.len() as u64).to_le_bytes());
        for v in items {
            self.kvs.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    /// A tensor of GGML type `ty` (its id) with dims `dims` (innermost first) and its encoded
    /// bytes as given.
    pub fn raw_tensor(mut self, name: &str, dims: &[u64], ty: u32, bytes: Vec<u8>) -> Builder {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, bytes));
        self
    }

    /// An F32 tensor with the given values.
    pub fn f32_tensor(mut self, name: &str, values: &[f32]) -> Builder {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.to_string(), vec![values.len() as u64], 0, data));
        self
    }

    /// An F32 matrix of `rows` rows of `cols` values (GGUF dims `[cols, rows]`), row-major.
    pub fn f32_matrix(mut self, name: &str, cols: usize, rows: usize, values: &[f32]) -> Builder {
        assert_eq!(values.len(), cols * rows, "{name}: {cols}×{rows} values");
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.to_string(), vec![cols as u64, rows as u64], 0, data));
        self
    }

    /// The file's bytes.
    pub fn build(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.kv_count.to_le_bytes());
        out.extend_from_slice(&self.kvs);
        let mut offset = 0u64;
        let mut data = Vec::new();
        for (name, dims, ty, bytes) in &self.tensors {
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            data.extend_from_slice(bytes);
            let padded = (data.len() as u64).div_ceil(self.alignment) * self.alignment;
            data.resize(padded as usize, 0);
            offset = padded;
        }
        let start = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        out.resize(start as usize, 0);
        out.extend_from_slice(&data);
        out
    }
}

/// A small but complete model-like file.
pub fn sample() -> Vec<u8> {
    Builder::new()
        .string("general.architecture", "llama")
        .u32("tokenizer.ggml.eos_token_id", 2)
        .strings("tokenizer.ggml.tokens", &["<s>", "</s>", "<eot>", "hi"])
        .string("tokenizer.chat_template", "{{ messages }}")
        .f32_tensor(
            "token_embd.weight",
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        )
        .f32_tensor("output_norm.weight", &[0.5; 8])
        .build()
}
