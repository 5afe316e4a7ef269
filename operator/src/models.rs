//! Models onto a fleet: a manifest made from the files with the engine's own check of how they
//! fit each board size ([`manifest`]), then per box a resumable push a chunk at a time
//! ([`push`]), a switch through the box's health gate ([`switch`]), a removal ([`remove`]) and
//! the list ([`list`]). Every request is pinned to the box's enrolled certificate
//! ([`fleet::connect`]).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weights::Manifest;
use weights::install::sig_path;
use wire::models::{Incoming, Models, Part, Push, Requested, UseRequest};

use crate::fleet::Connected;

/// The usual deadline of a request.
const ASK: Duration = Duration::from_secs(30);
/// A chunk's deadline: its upload, and for the last one the box's check of the whole model.
const CHUNK: Duration = Duration::from_secs(300);
/// Tries of one chunk before the push gives up (a later `push` resumes it).
const TRIES: u32 = 5;

/// What `appliance model manifest` makes: the manifest, and the engine's report it records.
pub struct Made {
    /// The manifest.
    pub manifest: Manifest,
    /// What the engine found.
    pub fit: weights::fit::Report,
}

/// The engine binary beside this tool, else `engine` on `PATH`.
pub fn engine_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("engine")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("engine"))
}

/// Asks `engine fit` whether `file` (and its draft head) load, and what context fits each
/// board size.
pub fn fit(
    engine: &Path,
    file: &Path,
    draft: Option<&Path>,
) -> Result<weights::fit::Report, String> {
    let mut command = std::process::Command::new(engine);
    command.arg("fit").arg("-m").arg(file);
    if let Some(draft) = draft {
        command.arg("--model-draft").arg(draft);
    }
    let out = command
        .output()
        .map_err(|e| format!("running {} fit: {e} (give --engine PATH)", engine.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the engine does not load {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{} fit answered something else: {e}", engine.display()))
}

/// The manifest for `file` (and `draft`), from `template` when given; the engine settings it
/// records are the template's, with a context no longer than what the smallest board the
/// model fits holds (8192 at most when the template sets none).
pub fn manifest(
    engine: &Path,
    file: &Path,
    draft: Option<&Path>,
    template: Option<&Path>,
    id: Option<String>,
    chunk_size: Option<u64>,
) -> Result<Made, String> {
    let fit = fit(engine, file, draft)?;
    let mut manifest = weights::author::manifest(file, draft, id, chunk_size, template)
        .map_err(|e| e.to_string())?;
    let templated = template.is_some_and(|t| {
        std::fs::read_to_string(t).is_ok_and(|text| text.lines().any(|l| l.trim() == "[engine]"))
    });
    let smallest = fit
        .boards
        .iter()
        .filter(|b| b.max_context > 0)
        .min_by_key(|b| b.memory_gib);
    let Some(smallest) = smallest else {
        return Err(format!(
            "{} does not fit any board size checked ({}): it needs {} MiB",
            file.display(),
            fit.boards
                .iter()
                .map(|b| format!("{} GB", b.memory_gib))
                .collect::<Vec<_>>()
                .join(", "),
            fit.need_bytes >> 20
        ));
    };
    if !templated {
        manifest.engine.context = u32::try_from(fit.context.min(8192)).unwrap_or(8192);
    }
    let cap = u32::try_from(smallest.max_context).unwrap_or(u32::MAX);
    manifest.engine.context = manifest.engine.context.min(cap);
    manifest.fits = fit.fits();
    manifest.check().map_err(|e| e.to_string())?;
    Ok(Made { manifest, fit })
}

/// A signed manifest read for a push: its text, its signature (`M.sig`), and the files named
/// on the command line checked against it before anything is sent.
pub struct Signed {
    /// The manifest.
    pub manifest: Manifest,
    /// What goes to the boxes.
    pub push: Push,
    /// The model's files, in the push's part order.
    pub files: Vec<PathBuf>,
}

/// Reads `manifest` and its signature and checks the sizes of `files` (the weights, then the
/// draft head) against it; their chunks are checked as they are sent.
pub fn signed(manifest: &Path, files: &[PathBuf]) -> Result<Signed, String> {
    let text = Manifest::read_text(manifest).map_err(|e| e.to_string())?;
    let parsed =
        Manifest::parse(&text, &manifest.display().to_string()).map_err(|e| e.to_string())?;
    let sig = sig_path(manifest);
    let signature = std::fs::read_to_string(&sig).map_err(|e| {
        format!(
            "{}: {e}; sign the manifest first (`appliance model sign {} --key fleet-key`)",
            sig.display(),
            manifest.display()
        )
    })?;
    let wanted = 1 + usize::from(parsed.draft.is_some());
    if files.len() != wanted {
        return Err(format!(
            "model {} has {wanted} file(s) ({}{}); give {}",
            parsed.id,
            parsed.file,
            parsed
                .draft
                .as_ref()
                .map(|d| format!(", draft head {}", d.file))
                .unwrap_or_default(),
            if wanted == 2 {
                "the weights, then the draft head"
            } else {
                "the weights only"
            }
        ));
    }
    // Sizes now; each chunk's hash as it is read to be sent.
    let sizes = std::iter::once(parsed.size).chain(parsed.draft.as_ref().map(|d| d.size));
    for (file, size) in files.iter().zip(sizes) {
        let len = std::fs::metadata(file)
            .map_err(|e| format!("{}: {e}", file.display()))?
            .len();
        if len != size {
            return Err(format!(
                "{} is {len} bytes; manifest {} names a file of {size}: the wrong file, or a \
                 truncated download?",
                file.display(),
                parsed.id
            ));
        }
    }
    Ok(Signed {
        manifest: parsed,
        push: Push {
            manifest: text,
            signature,
        },
        files: files.to_vec(),
    })
}

/// Why box `name` refused, from its answer.
fn refusal(name: &str, response: &crate::https::Response) -> String {
    format!(
        "{name}: refused ({}): {}",
        response.status,
        String::from_utf8_lossy(&response.body).trim()
    )
}

/// A box's answer as `T`, or why it refused.
fn answer<T: serde::de::DeserializeOwned>(
    name: &str,
    response: &crate::https::Response,
    ok: &[u16],
) -> Result<T, String> {
    if !ok.contains(&response.status) {
        return Err(refusal(name, response));
    }
    serde_json::from_slice(&response.body).map_err(|e| format!("{name}: unexpected answer: {e}"))
}

/// Chunks in flight at once: the network, the box's hashing and its disk work side by side.
const IN_FLIGHT: usize = 3;

/// Pushes the model to `to`: asks what the box holds (a push that broke off resumes), sends
/// each missing chunk (a few at once, each retried a few times when the connection breaks),
/// and returns once the box has installed it. Each chunk is checked against the manifest here
/// before it is sent, so a wrong or damaged local file stops the push at its first bad chunk.
/// `say` gets progress lines.
pub fn push(
    to: &Connected,
    token: &str,
    model: &Signed,
    say: &(dyn Fn(&str) + Sync),
) -> Result<String, String> {
    let name = &to.name;
    let body = serde_json::to_vec(&model.push).map_err(|e| e.to_string())?;
    let start = || -> Result<Incoming, String> {
        let r = to.ask(
            token,
            "POST",
            "/api/models/push",
            Some(("application/json", &body)),
            ASK,
        )?;
        answer(name, &r, &[200])
    };
    let began = Instant::now();
    let mut sent = 0;
    // A round sends what the box said was missing; one more asks again (a chunk a concurrent
    // push of the same model took away, say) and finds the model installed.
    for _round in 0..3 {
        let state = start()?;
        if state.installed {
            if sent == 0 {
                return Ok(format!("{name}: {} already installed", model.manifest.id));
            }
            let seconds = began.elapsed().as_secs_f64().max(1e-3);
            return Ok(format!(
                "{name}: {} installed ({} MiB sent in {seconds:.1} s, {:.1} MiB/s)",
                model.manifest.id,
                sent >> 20,
                sent as f64 / f64::from(1 << 20) / seconds
            ));
        }
        let total: u64 = state.parts.iter().map(|p| p.size).sum();
        let missing: Vec<(usize, Part, u64)> = state
            .missing()
            .map(|(part, index)| {
                let slot = state
                    .parts
                    .iter()
                    .position(|p| p.part == part.part)
                    .unwrap_or(0);
                (slot, part.clone(), index)
            })
            .collect();
        let still: u64 = missing.iter().map(|(_, p, i)| chunk_length(p, *i)).sum();
        if still < total {
            say(&format!(
                "{name}: resuming: {} of {} MiB still to send",
                still >> 20,
                total >> 20
            ));
        }
        // The box's answer names the parts; the URL takes the local manifest's id.
        sent += send_all(
            to,
            token,
            model,
            &model.manifest.id,
            missing,
            total.saturating_sub(still),
            total,
            say,
        )?;
    }
    Err(format!(
        "{name}: the box still misses chunks of {} after three rounds",
        model.manifest.id
    ))
}

/// Sends `missing` ((file slot, part, index), in order) with [`IN_FLIGHT`] workers; the bytes
/// sent. The first refusal stops every worker.
#[allow(clippy::too_many_arguments)]
fn send_all(
    to: &Connected,
    token: &str,
    model: &Signed,
    id: &str,
    missing: Vec<(usize, Part, u64)>,
    already: u64,
    total: u64,
    say: &(dyn Fn(&str) + Sync),
) -> Result<u64, String> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let queue = Mutex::new(missing.into_iter());
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let said = AtomicU64::new((already * 10 / total.max(1)) * 10);
    let worker = || {
        while !stop.load(Ordering::Relaxed) {
            let next = queue.lock().ok().and_then(|mut q| q.next());
            let Some((slot, part, index)) = next else {
                return;
            };
            match send_one(to, token, model, id, slot, &part, index, say) {
                Ok(length) => {
                    let done = already + sent.fetch_add(length, Ordering::Relaxed) + length;
                    let percent = done * 100 / total.max(1);
                    let tenth = percent - percent % 10;
                    if said.fetch_max(tenth, Ordering::Relaxed) < tenth {
                        say(&format!(
                            "{}: {} of {} MiB ({percent}%)",
                            to.name,
                            done >> 20,
                            total >> 20
                        ));
                    }
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    if let Ok(mut first) = failed.lock() {
                        first.get_or_insert(e);
                    }
                    return;
                }
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 0..IN_FLIGHT {
            scope.spawn(worker);
        }
    });
    match failed.into_inner().ok().flatten() {
        Some(e) => Err(e),
        None => Ok(sent.into_inner()),
    }
}

/// Reads chunk `index` of `part` from its file, checks it against the manifest, and sends it
/// (again, up to [`TRIES`] times, when the connection breaks); its length.
#[allow(clippy::too_many_arguments)]
fn send_one(
    to: &Connected,
    token: &str,
    model: &Signed,
    id: &str,
    slot: usize,
    part: &Part,
    index: u64,
    say: &(dyn Fn(&str) + Sync),
) -> Result<u64, String> {
    let file = model
        .files
        .get(slot)
        .ok_or_else(|| format!("{}: no file for part {}", to.name, part.part))?;
    let offset = index.saturating_mul(part.chunk_size);
    let length = chunk_length(part, index);
    let bytes = read_at(file, offset, length)?;
    let hashes = match slot {
        0 => Some(&model.manifest.chunks),
        _ => model.manifest.draft.as_ref().map(|d| &d.chunks),
    };
    let expected = hashes.and_then(|h| h.get(usize::try_from(index).ok()?));
    let digest = weights::hash::to_hex(&weights::hash::sha256(&bytes));
    if expected != Some(&digest) {
        return Err(format!(
            "{} (bytes {offset}..{}) differs from manifest {}: not the approved file, or damaged",
            file.display(),
            offset + length,
            model.manifest.id
        ));
    }
    let path = format!("/api/models/incoming/{id}/{}/{index}", part.part);
    let mut tries = 0;
    loop {
        tries += 1;
        match to.ask(
            token,
            "PUT",
            &path,
            Some(("application/octet-stream", &bytes)),
            CHUNK,
        ) {
            Ok(r) if r.status == 200 => return Ok(length),
            Ok(r) => return Err(refusal(&to.name, &r)),
            Err(e) if tries < TRIES => {
                say(&format!("{e}; trying chunk {index} of {} again", part.part));
                std::thread::sleep(Duration::from_secs(2 * u64::from(tries)));
            }
            Err(e) => {
                return Err(format!(
                    "{e}; the push stopped at chunk {index} of {}: run it again to resume",
                    part.part
                ));
            }
        }
    }
}

/// The length of chunk `index` of `part` (0 past its end; the values are the box's).
fn chunk_length(part: &Part, index: u64) -> u64 {
    part.size
        .saturating_sub(index.saturating_mul(part.chunk_size))
        .min(part.chunk_size)
}

/// `length` bytes of `file` from `offset`.
fn read_at(file: &Path, offset: u64, length: u64) -> Result<Vec<u8>, String> {
    let what = |e: std::io::Error| format!("reading {}: {e}", file.display());
    let mut f = std::fs::File::open(file).map_err(what)?;
    f.seek(SeekFrom::Start(offset)).map_err(what)?;
    let mut bytes = vec![0; usize::try_from(length).map_err(|e| e.to_string())?];
    f.read_exact(&mut bytes).map_err(what)?;
    Ok(bytes)
}

/// Switches `on` to model `id` and waits (at most `wait`) for the box's verdict: `Ok` once it
/// committed, `Err` with the box's reason when it rolled back or refused.
pub fn switch(on: &Connected, token: &str, id: &str, wait: Duration) -> Result<String, String> {
    let name = &on.name;
    let body = serde_json::to_vec(&UseRequest { id: id.to_string() }).map_err(|e| e.to_string())?;
    let r = on.ask(
        token,
        "POST",
        "/api/models/use",
        Some(("application/json", &body)),
        ASK,
    )?;
    if r.status == 200 {
        return Ok(format!("{name}: {id} is already the active model"));
    }
    let Requested { request } = answer(name, &r, &[202])?;
    let deadline = Instant::now() + wait;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let models = list(on, token)?;
        if let Some(outcome) = models.outcome(request) {
            return if outcome.result == "committed" {
                Ok(format!("{name}: now runs {id} ({})", outcome.reason))
            } else {
                Err(format!(
                    "{name}: switch to {id} {}: {}",
                    outcome.result, outcome.reason
                ))
            };
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{name}: no verdict on the switch to {id} within {} s",
                wait.as_secs()
            ));
        }
    }
}

/// Removes model `id` from `on` (the box refuses its active and fallback models).
pub fn remove(on: &Connected, token: &str, id: &str) -> Result<String, String> {
    let r = on.ask(token, "DELETE", &format!("/api/models/{id}"), None, ASK)?;
    if r.status != 200 {
        return Err(refusal(&on.name, &r));
    }
    Ok(format!(
        "{}: {}",
        on.name,
        String::from_utf8_lossy(&r.body).trim()
    ))
}

/// The models of `on`.
pub fn list(on: &Connected, token: &str) -> Result<Models, String> {
    let r = on.ask(token, "GET", "/api/models", None, ASK)?;
    answer(&on.name, &r, &[200])
}

/// One box's models as lines: each installed model (active `*`, fallback `f`), its size,
/// who signed it, when it was last verified; pushes under way; the last switch.
pub fn lines(name: &str, models: &Models) -> String {
    let mut out = String::new();
    for m in &models.installed {
        let mark = models.mark(&m.id);
        let state = m.problem.clone().unwrap_or_else(|| match m.verified_unix {
            Some(t) => format!("verified at {t}"),
            None => "not verified yet".into(),
        });
        let signer: String = m.signed_by.chars().take(16).collect();
        out.push_str(&format!(
            "{name:16} {mark} {:32} {:>8} MiB  {}  signed {signer}  {state}\n",
            m.id,
            m.size >> 20,
            if m.draft { "+draft" } else { "      " },
        ));
    }
    for push in &models.incoming {
        let (got, all) = push.chunk_counts();
        out.push_str(&format!(
            "{name:16}   {:32} push under way: {got} of {all} chunks\n",
            push.id
        ));
    }
    if let Some(last) = models.history.last() {
        out.push_str(&format!(
            "{name:16}   last switch: {} -> {} {}: {}\n",
            last.from.as_deref().unwrap_or("?"),
            last.to,
            last.result,
            last.reason
        ));
    }
    out
}
