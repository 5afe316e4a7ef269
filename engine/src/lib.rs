//! The Appliance inference engine: runs GGUF language models on the CPU and serves them through an
//! OpenAI-compatible HTTP API.
//!
//! Built so far: [`model_file`] (a validated, memory-mapped GGUF with zero-copy tensor views) and
//! [`quant`] (every tensor format's scalar reference, the oracle for the SIMD kernels to come).
//! Tokenizers, the architectures, sampling and the server land with the engine issues.

pub mod model_file;
pub mod quant;

/// The engine's name and version as reported to clients and logs.
pub fn version() -> String {
    format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}
