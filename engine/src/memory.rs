//! Whether a model, its context and its caches fit the memory this process may use, checked
//! before anything large is allocated: a box whose engine the kernel kills for memory has no
//! answer and no message, so a model that cannot fit is refused with one instead.
//!
//! The limit is the smallest of the cgroup v2 `memory.max` of this process's cgroup and its
//! ancestors (the supervisor sets one for the engine, with no swap) and the machine's
//! `MemTotal`; `--memory-limit` overrides it. The paged-in weights count: they are file pages
//! charged to the cgroup, and every token of a dense model reads all of them, so evicting them
//! only thrashes. Of a mixture of experts only the share a token uses must stay (`k` of `n`
//! experts): the rest is read from storage as routing asks, slower but alive, which is how a
//! Qwen3-30B-A3B runs on an 8 GB board.

use std::path::{Path, PathBuf};

use crate::model::{Hparams, MAX_BATCH, Model};
use crate::speculate::MAX_DRAFT;

const MIB: u64 = 1 << 20;

/// Room kept for what is not sized here: the tokenizer, grammar tries, threads' stacks, the
/// HTTP server, the allocator's slack.
const OVERHEAD: u64 = 64 * MIB;

/// The memory this process may use, and where that figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from, for messages.
    pub source: String,
}

impl Limit {
    /// A limit given on the command line (`--memory-limit`, in MiB).
    pub fn given(mib: u64) -> Limit {
        Limit {
            bytes: mib.saturating_mul(MIB),
            source: "--memory-limit".into(),
        }
    }

    /// The limit of the system rooted at `root` (`/` on a real system): the smallest
    /// `memory.max` from this process's cgroup up, and `MemTotal`; `None` when neither can be
    /// read (no /proc).
    pub fn detect(root: &Path) -> Option<Limit> {
        let mut best: Option<Limit> = mem_total(root).map(|bytes| Limit {
            bytes,
            source: "MemTotal in /proc/meminfo".into(),
        });
        for (bytes, file) in cgroup_limits(root) {
            if best.as_ref().is_none_or(|b| bytes < b.bytes) {
                best = Some(Limit {
                    bytes,
                    source: format!("memory.max of cgroup {}", file.display()),
                });
            }
        }
        best
    }
}

/// `MemTotal` of `root/proc/meminfo`, in bytes.
fn mem_total(root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The finite `memory.max` values of this process's cgroup v2 and every ancestor, each with
/// its cgroup's path.
fn cgroup_limits(root: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(text) = std::fs::read_to_string(root.join("proc/self/cgroup")) else {
        return Vec::new();
    };
    // cgroup v2 is the line with hierarchy 0 and no controllers: "0::/system.slice/x.service".
    let Some(path) = text.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Vec::new();
    };
    let mut limits = Vec::new();
    let mut cgroup = PathBuf::from(path.trim());
    loop {
        let relative = cgroup.strip_prefix("/").unwrap_or(&cgroup);
        // A path with `..` cannot come from the kernel; not following it keeps the walk inside
        // the cgroup tree.
        if relative
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Vec::new();
        }
        let file = root.join("sys/fs/cgroup").join(relative).join("memory.max");
        if let Ok(value) = std::fs::read_to_string(&file)
            && let Ok(bytes) = value.trim().parse::<u64>()
        {
            limits.push((bytes, cgroup.clone()));
        }
        if !cgroup.pop() {
            return limits;
        }
    }
}

/// What serving a model takes, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// The model file's pages that must stay in memory: all of a dense model, a mixture of
    /// experts' shared weights and the used share of its experts.
    pub weights: u64,
    /// Weights copied in another layout for the kernels: Q5_0 widened for batches, K-quants
    /// with sixteen rows side by side.
    pub copies: u64,
    /// Keys and values of one conversation's context, and a recurrent model's state with its
    /// checkpoints and rollback mark (the same at any length).
    pub kv: u64,
    /// Kept conversation caches.
    pub kept: u64,
    /// Activations and logits of the largest pass.
    pub work: u64,
    /// The context the KV figure is for.
    pub context: usize,
    /// Keys and values of one context token.
    pub kv_per_token: u64,
}

/// Bytes of one context's keys and values (f16 each).
fn kv_bytes(h: &Hparams, context: usize) -> u64 {
    (context * h.kv_bytes_per_position()) as u64
}

impl Need {
    /// What `model` (from a file of `file_bytes`) takes with a context of `context` tokens and
    /// `kept_mib` MiB for kept conversations (at least one is kept when it is not 0); a context
    /// the model cannot hold at all is refused as such.
    pub fn of(
        model: &Model<'_>,
        file_bytes: u64,
        context: usize,
        kept_mib: usize,
    ) -> Result<Need, String> {
        let h = &model.hparams;
        h.check_context(context)?;
        // A recurrent state: the live one, its rollback mark's copy and record, and the
        // checkpoints.
        let state = (h.recurrent_bytes() * (2 + crate::model::MAX_CHECKPOINTS)
            + h.rollback_record_bytes(crate::model::ROLLBACK_TOKENS)) as u64;
        let kv = kv_bytes(h, context) + state;
        let kept = match kept_mib as u64 {
            0 => 0,
            mib => (mib * MIB).max(kv),
        };
        let (q_dim, kv_dim) = (h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
        let moe = h.n_expert + (h.n_expert_used + 2) * h.n_embd;
        let ple = h.n_embd_per_layer * h.n_layer;
        // A Gated DeltaNet layer's buffers: its convolution's input and output, gate, output
        // by head.
        let delta = h
            .delta
            .map_or(0, |d| 4 * d.channels() + 3 * d.value_dim() + 2 * d.v_heads);
        let ffn = 2 * h.n_ff.max(h.n_ff_shared);
        let per_token = 3 * h.n_embd + 2 * q_dim + 2 * kv_dim + ffn + moe + ple + delta;
        let work = (4 * (MAX_BATCH * per_token + (MAX_DRAFT + 1) * h.vocab)) as u64;
        let experts = model.expert_bytes() as u64;
        let used = match h.n_expert as u64 {
            0 => 0,
            n => experts * h.n_expert_used as u64 / n,
        };
        // Gemma 4's per-layer token embeddings are read a row per token through the map:
        // only the rows of the tokens in use are ever resident, a small share of the table.
        let row_read = model.row_read_bytes() as u64;
        // A copy with rows side by side stands in for its mapped rows: counted once, as a copy.
        let replaced = model.replaced_bytes() as u64;
        Ok(Need {
            weights: file_bytes.saturating_sub(experts + row_read + replaced) + used,
            copies: model.copied_bytes() as u64,
            kv,
            kept,
            work,
            context,
            kv_per_token: kv_bytes(h, 1),
        })
    }

    /// All of it, with the overhead.
    pub fn total(&self) -> u64 {
        self.weights + self.copies + self.kv + self.kept + self.work + OVERHEAD
    }

    /// Refuses what does not fit `limit`, saying what takes how much and what would fit.
    pub fn fits(&self, limit: &Limit) -> Result<(), String> {
        let total = self.total();
        if total <= limit.bytes {
            return Ok(());
        }
        let mib = |b: u64| b.div_ceil(MIB);
        let parts = format!(
            "weights {} MiB, KV cache (and recurrent state) for {} tokens {} MiB, kept \
             conversations {} MiB, work \
             buffers {} MiB, other {} MiB",
            mib(self.weights + self.copies),
            self.context,
            mib(self.kv),
            mib(self.kept),
            mib(self.work),
            mib(OVERHEAD)
        );
        let fixed = total - self.kv - self.kept;
        let room = limit.bytes.saturating_sub(fixed);
        let advice = if room < self.kv_per_token * 2 {
            "the model alone does not fit: use a smaller model or a smaller quant type, or raise \
             the limit"
                .to_string()
        } else if self.kept > self.kv {
            format!(
                "lower the kept conversations' memory (--cache-mib) or the context (-c); with \
                 --cache-mib 0 a context of up to {} tokens fits",
                room / self.kv_per_token
            )
        } else {
            // Each context token costs its keys and values once, and once more in the kept
            // conversation (a budget smaller than one conversation keeps one anyway).
            let per_token = self.kv_per_token * if self.kept > 0 { 2 } else { 1 };
            let tokens = room / per_token;
            format!("use a context of at most {tokens} tokens (-c {tokens}), or raise the limit")
        };
        Err(format!(
            "not enough memory: this model with a context of {} tokens needs {} MiB ({parts}), \
             but this process may use {} MiB ({}); {advice}",
            self.context,
            mib(total),
            limit.bytes / MIB,
            limit.source
        ))
    }
}

/// The most memory this process has held at once (`VmHWM`), in bytes.
pub fn peak_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let file = root.join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("dirs");
        std::fs::write(file, text).expect("write");
    }

    #[test]
    fn the_tightest_of_the_cgroups_and_the_machine_is_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(
            root,
            "proc/meminfo",
            "MemTotal:        8123456 kB\nMemFree: 1 kB\n",
        );
        assert_eq!(
            Limit::detect(root),
            Some(Limit {
                bytes: 8_123_456 * 1024,
                source: "MemTotal in /proc/meminfo".into()
            })
        );
        write(
            root,
            "proc/self/cgroup",
            "0::/system.slice/engine.service\n",
        );
        write(
            root,
            "sys/fs/cgroup/system.slice/engine.service/memory.max",
            "max\n",
        );
        write(
            root,
            "sys/fs/cgroup/system.slice/memory.max",
            "2147483648\n",
        );
        let limit = Limit::detect(root).expect("limit");
        assert_eq!(limit.bytes, 2 << 30);
        assert!(limit.source.contains("/system.slice"), "{}", limit.source);
        write(
            root,
            "sys/fs/cgroup/system.slice/engine.service/memory.max",
            "1073741824\n",
        );
        let limit = Limit::detect(root).expect("limit");
        assert_eq!(limit.bytes, 1 << 30);
        assert!(limit.source.contains("engine.service"), "{}", limit.source);
    }

    #[test]
    fn nothing_readable_means_no_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(Limit::detect(dir.path()), None);
        // A path climbing out of the cgroup tree is not followed.
        write(dir.path(), "proc/self/cgroup", "0::/../../etc\n");
        write(dir.path(), "etc/memory.max", "1\n");
        assert_eq!(Limit::detect(dir.path()), None);
    }
}
