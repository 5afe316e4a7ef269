//! An update's progress: `GET /api/update` (and the `202` answer to `POST /api/update`), how
//! the last bundle uploaded to the box is doing. Every field has a default.

use serde::{Deserialize, Serialize};

/// How the last upload is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// An install is under way. Default `false`.
    #[serde(default)]
    pub running: bool,
    /// Bytes received of the last upload.
    #[serde(default)]
    pub received: u64,
    /// RAUC's progress lines and the box's, newest last.
    #[serde(default)]
    pub lines: Vec<String>,
    /// How it ended: what happens next.
    #[serde(default)]
    pub done: Option<String>,
    /// Why it failed.
    #[serde(default)]
    pub error: Option<String>,
}
