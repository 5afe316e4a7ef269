//! The Appliance inference engine: runs GGUF language models on the CPU and serves them through an
//! OpenAI-compatible HTTP API.
//!
//! The GGUF reader, kernels, model architectures and server are built under the engine issues;
//! this crate currently holds the engine's identity, which the supervisor and the binary share.

/// The engine's name and version as reported to clients and logs.
pub fn version() -> String {
    format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}
