//! The models on a box and how they get there: `GET /api/models` ([`Models`]), a push
//! (`POST /api/models/push` with a [`Push`], answered with an [`Incoming`]; then each chunk
//! `PUT /api/models/incoming/ID/PART/INDEX`, in any order) and a switch (`POST /api/models/use` with a
//! [`UseRequest`]; its outcome is a [`Switch`] in the list's history). Every field a newer box
//! may add is optional.

use serde::{Deserialize, Serialize};

/// What `POST /api/models/push` carries: the signed manifest, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Push {
    /// The manifest's exact text (what the signature covers).
    pub manifest: String,
    /// Its signature file's text (`ed25519 KEY SIGNATURE`).
    pub signature: String,
}

/// A push under way (or just completed): what the box holds of each part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incoming {
    /// The model's id.
    pub id: String,
    /// The model's SHA-256 (of its main file): which push this is.
    pub sha256: String,
    /// Each file of the model, in the order they are sent.
    pub parts: Vec<Part>,
    /// Whether the model is installed (every chunk arrived, and the whole verified).
    #[serde(default)]
    pub installed: bool,
}

impl Incoming {
    /// Chunks received and chunks in all, over every part.
    pub fn chunk_counts(&self) -> (u64, u64) {
        self.parts
            .iter()
            .fold((0, 0), |(got, all), p| (got + p.received, all + p.chunks))
    }

    /// Every chunk still missing: its part and index, in order.
    pub fn missing(&self) -> impl Iterator<Item = (&Part, u64)> {
        self.parts
            .iter()
            .flat_map(|p| p.missing.iter().map(move |i| (p, *i)))
    }
}

/// One file of a model being pushed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// `model` (the weights) or `draft` (the draft head): the URL's PART.
    pub part: String,
    /// Its file name.
    pub file: String,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes per chunk (the last may be shorter).
    pub chunk_size: u64,
    /// How many chunks it has.
    pub chunks: u64,
    /// Chunks received and verified.
    pub received: u64,
    /// The chunks still to send (indices, ascending); they may be sent in any order and
    /// several at once.
    #[serde(default)]
    pub missing: Vec<u64>,
}

impl Part {
    /// Bytes of the part the box holds.
    pub fn received_bytes(&self) -> u64 {
        let missing: u64 = self
            .missing
            .iter()
            .map(|i| {
                self.size
                    .saturating_sub(i * self.chunk_size)
                    .min(self.chunk_size)
            })
            .sum();
        self.size.saturating_sub(missing)
    }
}

/// `POST /api/models/use`: switch the box to an installed model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UseRequest {
    /// The model's id.
    pub id: String,
}

/// The answer to a switch request: its number, to find its outcome in [`Models::history`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requested {
    /// The request's number.
    pub request: u64,
}

/// `GET /api/models`: the models on the box.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Models {
    /// The model the engine runs.
    #[serde(default)]
    pub active: Option<String>,
    /// The model a failed switch goes back to (the one active before the last switch).
    #[serde(default)]
    pub fallback: Option<String>,
    /// A switch asked for and not yet tried.
    #[serde(default)]
    pub requested: Option<SwitchRequest>,
    /// The switch under way.
    #[serde(default)]
    pub switching: Option<SwitchRequest>,
    /// Installed models.
    #[serde(default)]
    pub installed: Vec<Installed>,
    /// Pushes under way (or broken off, to be resumed).
    #[serde(default)]
    pub incoming: Vec<Incoming>,
    /// Past switches, newest last.
    #[serde(default)]
    pub history: Vec<Switch>,
    /// Bytes free on the data partition.
    #[serde(default)]
    pub free_bytes: Option<u64>,
}

impl Models {
    /// What installed model `id` is to the box: `active`, `fallback` or `installed`.
    pub fn role(&self, id: &str) -> &'static str {
        if self.active.as_deref() == Some(id) {
            "active"
        } else if self.fallback.as_deref() == Some(id) {
            "fallback"
        } else {
            "installed"
        }
    }

    /// The role of `id` as the tools' tables mark it: `*` active, `f` fallback, else blank.
    pub fn mark(&self, id: &str) -> &'static str {
        match self.role(id) {
            "active" => "*",
            "fallback" => "f",
            _ => " ",
        }
    }

    /// The outcome of switch request `request`, once there is one.
    pub fn outcome(&self, request: u64) -> Option<&Switch> {
        self.history.iter().rev().find(|s| s.request == request)
    }
}

/// A switch asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchRequest {
    /// Its number.
    pub request: u64,
    /// The model to switch to.
    pub to: String,
    /// When it was asked for (the box's clock).
    pub asked_unix: u64,
}

/// One installed model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Installed {
    /// Its id.
    pub id: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its files' total size in bytes.
    #[serde(default)]
    pub size: u64,
    /// The main file's SHA-256.
    #[serde(default)]
    pub sha256: String,
    /// Who signed its manifest: the key in hex, or `unsigned`.
    #[serde(default)]
    pub signed_by: String,
    /// Whether it has a draft head.
    #[serde(default)]
    pub draft: bool,
    /// When every chunk was last verified (the box's clock).
    #[serde(default)]
    pub verified_unix: Option<u64>,
    /// What is wrong with it, when its files or manifest do not check out.
    #[serde(default)]
    pub problem: Option<String>,
}

/// How a switch ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switch {
    /// The request's number.
    pub request: u64,
    /// The model switched to.
    pub to: String,
    /// The model active before.
    #[serde(default)]
    pub from: Option<String>,
    /// `committed`, `rolled-back` or `refused` (not tried: not installed, not verified).
    pub result: String,
    /// What happened, in words.
    #[serde(default)]
    pub reason: String,
    /// When it ended (the box's clock).
    #[serde(default)]
    pub ended_unix: u64,
}
