//! The JSON documents a box sends over its API, typed once: the status document
//! (`GET /api/status`, `supervisor status --json`), the enrolment and identity answers
//! (`POST /api/enroll`, `POST /api/identity`), an update's progress (`GET /api/update`) and
//! the models on a box and their pushes and switches (`/api/models`).
//! The supervisor builds them, its dashboard reads the status, and the `appliance` tool reads
//! them all from boxes that may run an older or a newer system than itself.
//!
//! # Versioning
//!
//! The status document carries [`status::Status::schema_version`], the major version
//! ([`SCHEMA_VERSION`]), and from minor version 1 on `schema_minor` ([`SCHEMA_MINOR`]; absent
//! means 0). The rules that let a tool and a box of different ages read each other:
//!
//! - a new field is a minor bump: it is optional (`Option`, or a documented default), so a
//!   reader built before it fills the default from an older box, and every reader ignores
//!   fields it does not know (no type here denies unknown fields);
//! - a field that changes meaning or disappears, or a new required one, is a major bump, and
//!   [`status::Status::from_json`] refuses a major version it does not know with a message
//!   saying so rather than misreading the document;
//! - the fields marked *required* on each type have been in every document since version 1;
//!   a document without one is not a status document and reading it fails with serde's
//!   message naming the field (`missing field ...`).
//!
//! States (`ready`, `verified`, `in-place`, ...) are carried as the words the box writes, not
//! as closed enums, so a word added by a newer box reads as itself rather than failing the
//! whole document; each field documents the words it takes today.
//!
//! The other documents follow the same additive rule (unknown fields ignored, new fields
//! optional) without a version field of their own: the enrolment and identity answers are
//! signed over a message with its own version tag (see `provision::enroll`).

pub mod cluster;
pub mod enrol;
pub mod models;
pub mod status;
pub mod update;

pub use enrol::{Answer, Identity, NonceRequest};
pub use status::Status;
pub use update::Progress;

/// The status document's major version: bumped only when a field changes meaning, disappears
/// or becomes required.
pub const SCHEMA_VERSION: u32 = 1;

/// The status document's minor version: bumped when a field is added. Written as
/// `schema_minor` only when not 0, so version 1.0 documents are what boxes always sent.
/// 1.1 added `engine.tool_calls`, 1.2 `models`, 1.3 `cluster`.
pub const SCHEMA_MINOR: u32 = 3;

/// Whether a number is 0 (serde's `skip_serializing_if` for fields that are absent at 0).
fn is_zero(n: &u32) -> bool {
    *n == 0
}
