//! The Appliance inference engine: runs GGUF language models on the CPU and serves them through an
//! OpenAI-compatible HTTP API.
//!
//! Built so far: [`model_file`] (a validated, memory-mapped GGUF with zero-copy tensor views),
//! [`quant`] (every tensor format's scalar reference, the oracle for the SIMD kernels to come),
//! [`model`] (the llama and gemma3 forward passes over a KV cache) and [`score`] (teacher-forced
//! log-probabilities). Tokenizers, sampling, qwen2/qwen3 and the server land with the engine issues.

pub mod bench;
pub mod chat;
pub mod generate;
pub mod grammar;
pub mod installed;
pub mod kernels;
pub mod model;
pub mod model_file;
#[allow(unsafe_code)]
pub mod pool;
pub mod quant;
pub mod sampler;
pub mod score;
pub mod server;
pub mod speculate;
pub mod tokenizer;
