//! The Appliance inference engine: runs GGUF language models on the CPU and serves them through an
//! OpenAI-compatible HTTP API.
//!
//! [`model_file`] (a validated, memory-mapped GGUF with zero-copy tensor views), [`quant`] (every
//! tensor format's scalar reference), [`kernels`] (the SIMD products, checked against it),
//! [`model`] (llama, qwen2, qwen3, qwen3moe and gemma3 forward passes over a KV cache), [`tokenizer`] and
//! [`chat`], [`sampler`] and [`grammar`], [`speculate`] (lossless n-gram drafts), [`memory`]
//! (whether a model fits before it is run), [`score`] (teacher-forced log-probabilities),
//! [`bench`] and [`server`].

pub mod bench;
pub mod chat;
pub mod generate;
pub mod grammar;
pub mod installed;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod model_file;
#[allow(unsafe_code)]
pub mod pool;
pub mod quant;
pub mod reasoning;
pub mod sampler;
pub mod score;
pub mod server;
pub mod speculate;
pub mod tokenizer;
pub mod tools;
