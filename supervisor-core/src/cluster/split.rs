//! Which layers each member holds. llama.cpp keeps the input layer and the first layers on the
//! head's CPU, and puts the last `-ngl − 1` repeating layers and the output layer on its RPC
//! devices, each a consecutive run in `--rpc` order by the `--tensor-split` proportions
//! (`src/llama-model.cpp`, `load_tensors`). By default it would split by each server's free
//! memory, which a worker reports for its whole machine, not for its share; so the head plans
//! the split itself from the model's tensors and each member's `memory_mib`, and refuses a
//! model the members cannot hold before anything starts.

use std::ops::Range;
use std::path::Path;

use gguf::{Header, TensorInfo, Value};
use serde::{Deserialize, Serialize};

/// A member and the bytes its share may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// Bytes of memory for its layers and their cache.
    pub budget: u64,
}

/// One member's share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The member.
    pub member: String,
    /// The repeating layers it holds.
    pub layers: Range<usize>,
    /// Whether it holds the output layer (the last worker does).
    pub output: bool,
    /// Bytes of weights and cache it holds.
    pub bytes: u64,
    /// Bytes it may hold.
    pub budget: u64,
}

/// The whole split: the head's share first, then each worker's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// The model's repeating layers.
    pub layers: usize,
    /// Each member's share, in order.
    pub shares: Vec<Share>,
}

impl Split {
    /// `-ngl`: every layer the workers hold, and the output layer.
    pub fn gpu_layers(&self) -> usize {
        self.shares
            .iter()
            .skip(1)
            .map(|s| s.layers.len())
            .sum::<usize>()
            + 1
    }

    /// `--tensor-split`: each worker's count of layers, the output counted with the last.
    pub fn tensor_split(&self) -> String {
        let workers = &self.shares[1.min(self.shares.len())..];
        workers
            .iter()
            .map(|s| (s.layers.len() + usize::from(s.output)).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// More layers than any model has: a count past it is a damaged file.
const MAX_LAYERS: usize = 4096;

/// The model's sizes the split needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of each repeating layer's weights and its cache at the planned context.
    pub layer: Vec<u64>,
    /// Bytes the head holds besides its layers (the input embedding, the rest).
    pub head: u64,
    /// Bytes of the output layer (its norm and projection; the embedding when they are tied).
    pub output: u64,
}

/// The sizes of the GGUF model at `path` for `context` tokens of f16 cache.
pub fn sizes(path: &Path, context: u64) -> Result<Sizes, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: the file was verified by the gate and is only read; a change under the map can
    // only give wrong sizes, which the launch then fails on.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| format!("{}: cannot map: {e}", path.display()))?;
    let header = Header::parse(&map).map_err(|e| format!("{}: {e}", path.display()))?;
    from_header(&header, &map, context).map_err(|e| format!("{}: {e}", path.display()))
}

fn number(header: &Header, key: &str) -> Option<u64> {
    header.get(key).and_then(Value::as_u64)
}

/// A per-layer count: one number for every layer, or an array with one per layer.
fn per_layer(header: &Header, file: &[u8], key: &str, layers: usize) -> Option<Vec<u64>> {
    let entry = header.entry(key)?;
    if let Some(n) = entry.value.as_u64() {
        return Some(vec![n; layers]);
    }
    let counts = gguf::arrays::counts(file, entry).ok()?;
    (counts.len() == layers).then_some(counts)
}

fn from_header(header: &Header, file: &[u8], context: u64) -> Result<Sizes, String> {
    let arch = match header.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err("no general.architecture".into()),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let layers = number(header, &key("block_count"))
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| (1..=MAX_LAYERS).contains(&n))
        .ok_or_else(|| format!("no block_count of 1 to {MAX_LAYERS}"))?;
    let embedding = number(header, &key("embedding_length")).ok_or("no embedding_length")?;
    let heads = per_layer(header, file, &key("attention.head_count"), layers)
        .ok_or("no attention.head_count")?;
    let kv_heads = per_layer(header, file, &key("attention.head_count_kv"), layers)
        .unwrap_or_else(|| heads.clone());
    let mut layer = vec![0u64; layers];
    let (mut head, mut output, mut embedding_bytes, mut tied) = (0u64, 0u64, 0u64, true);
    for TensorInfo { name, size, .. } in &header.tensors {
        let block = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        match block {
            Some(i) if i < layers => layer[i] = layer[i].saturating_add(*size),
            _ if name.starts_with("output.") || name.starts_with("output_norm.") => {
                tied &= !name.starts_with("output.");
                output = output.saturating_add(*size);
            }
            _ => {
                if name.starts_with("token_embd.") {
                    embedding_bytes = embedding_bytes.saturating_add(*size);
                }
                head = head.saturating_add(*size);
            }
        }
    }
    if tied {
        // llama.cpp loads a copy of the embedding as the output projection.
        output = output.saturating_add(embedding_bytes);
    }
    for (i, bytes) in layer.iter_mut().enumerate() {
        let per_head = |k: &str| number(header, &key(k));
        let key_length =
            per_head("attention.key_length").unwrap_or_else(|| embedding / heads[i].max(1));
        let value_length = per_head("attention.value_length").unwrap_or(key_length);
        // K and V in f16 for every token of context.
        *bytes = bytes.saturating_add(
            context
                .saturating_mul(kv_heads[i])
                .saturating_mul(key_length.saturating_add(value_length))
                .saturating_mul(2),
        );
    }
    Ok(Sizes {
        layer,
        head,
        output,
    })
}

/// Splits `sizes` over `members` (the head first): each takes a consecutive run of layers, in
/// proportion to its budget, never more than its budget; the last worker holds the output.
pub fn plan(sizes: &Sizes, members: &[Member]) -> Result<Split, String> {
    let (head, workers) = members
        .split_first()
        .filter(|(_, w)| !w.is_empty())
        .ok_or("a cluster needs a head and at least one worker")?;
    let mib = |b: u64| b.div_ceil(1 << 20);
    let total = sizes
        .layer
        .iter()
        .fold(sizes.head.saturating_add(sizes.output), |a, b| {
            a.saturating_add(*b)
        });
    let budgets = members.iter().fold(0u64, |a, m| a.saturating_add(m.budget));
    let too_big = || {
        format!(
            "the model needs {} MiB (weights and cache) and the members hold {} MiB ({}); add a worker, give them more memory_mib, or lower the context",
            mib(total),
            mib(budgets),
            members
                .iter()
                .map(|m| format!("{} {} MiB", m.name, mib(m.budget)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    // What each member has for layers once the fixed parts are placed.
    let mut room: Vec<u64> = members.iter().map(|m| m.budget).collect();
    room[0] = head.budget.checked_sub(sizes.head).ok_or_else(too_big)?;
    let last = members.len() - 1;
    room[last] = workers[workers.len() - 1]
        .budget
        .checked_sub(sizes.output)
        .ok_or_else(too_big)?;
    // Proportional targets, cumulative: member j stops once its run would pass its share.
    let layer_total = sizes.layer.iter().fold(0u64, |a, b| a.saturating_add(*b));
    let room_total = room.iter().fold(0u64, |a, b| a.saturating_add(*b)).max(1);
    let mut runs = vec![0usize; members.len()];
    let mut used = vec![0u64; members.len()];
    let (mut member, mut placed) = (0usize, 0u64);
    let target = |j: usize| -> u64 {
        let through = room[..=j].iter().fold(0u64, |a, b| a.saturating_add(*b));
        (u128::from(layer_total) * u128::from(through) / u128::from(room_total)) as u64
    };
    for (i, &bytes) in sizes.layer.iter().enumerate() {
        // The last worker must hold at least one layer: it holds the output after it.
        let left = sizes.layer.len() - i;
        loop {
            let over_share = member < last && placed.saturating_add(bytes / 2) > target(member);
            let over_room = used[member].saturating_add(bytes) > room[member];
            let keep_one_for_last = member < last && left <= last - member;
            if (over_share || over_room || keep_one_for_last) && member < last {
                member += 1;
                continue;
            }
            if over_room {
                return Err(too_big());
            }
            break;
        }
        runs[member] += 1;
        used[member] = used[member].saturating_add(bytes);
        placed = placed.saturating_add(bytes);
    }
    if runs[last] == 0 {
        return Err(format!(
            "the model has {} layers, too few for {} members",
            sizes.layer.len(),
            members.len()
        ));
    }
    let mut start = 0;
    let shares = members
        .iter()
        .enumerate()
        .map(|(j, m)| {
            let layers = start..start + runs[j];
            start = layers.end;
            let fixed = match j {
                0 => sizes.head,
                j if j == last => sizes.output,
                _ => 0,
            };
            Share {
                member: m.name.clone(),
                layers,
                output: j == last,
                bytes: used[j].saturating_add(fixed),
                budget: m.budget,
            }
        })
        .collect();
    Ok(Split {
        layers: sizes.layer.len(),
        shares,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(budgets: &[u64]) -> Vec<Member> {
        budgets
            .iter()
            .enumerate()
            .map(|(i, &budget)| Member {
                name: format!("m{i}"),
                budget,
            })
            .collect()
    }

    #[test]
    fn layers_follow_the_budgets_and_the_last_worker_holds_the_output() {
        let sizes = Sizes {
            layer: vec![10; 12],
            head: 5,
            output: 5,
        };
        let split = plan(&sizes, &members(&[45, 45, 45])).expect("fits");
        let runs: Vec<_> = split.shares.iter().map(|s| s.layers.clone()).collect();
        assert_eq!(runs, vec![0..4, 4..8, 8..12]);
        assert_eq!(split.gpu_layers(), 9, "8 worker layers and the output");
        assert_eq!(split.tensor_split(), "4,5");
        assert!(split.shares.iter().all(|s| s.bytes <= s.budget));
        // A small head keeps fewer layers; an uneven budget is followed.
        let split = plan(&sizes, &members(&[25, 100, 20])).expect("fits");
        let runs: Vec<_> = split.shares.iter().map(|s| s.layers.len()).collect();
        assert_eq!(runs.iter().sum::<usize>(), 12);
        assert!(runs[1] > runs[0] && runs[2] >= 1, "{runs:?}");
        assert!(
            split.shares.iter().all(|s| s.bytes <= s.budget),
            "{split:?}"
        );
    }

    #[test]
    fn a_model_the_members_cannot_hold_is_refused_with_the_sums() {
        let sizes = Sizes {
            layer: vec![10 << 20; 12],
            head: 5 << 20,
            output: 5 << 20,
        };
        let e = plan(&sizes, &members(&[40 << 20, 40 << 20])).expect_err("too big");
        assert!(
            e.contains("needs 130 MiB") && e.contains("hold 80 MiB"),
            "{e}"
        );
        let e = plan(&sizes, &members(&[1 << 30])).expect_err("no worker");
        assert!(e.contains("at least one worker"), "{e}");
    }

    #[test]
    fn sizes_come_from_the_tensors_and_the_cache_from_the_context() {
        let file = gguf::testfile::Builder::new()
            .string("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .u32("llama.embedding_length", 8)
            .u32("llama.attention.head_count", 2)
            .u32("llama.attention.head_count_kv", 1)
            .f32_tensor("token_embd.weight", &[0.0; 32])
            .f32_tensor("blk.0.attn_q.weight", &[0.0; 16])
            .f32_tensor("blk.1.attn_q.weight", &[0.0; 8])
            .f32_tensor("output_norm.weight", &[0.0; 8])
            .build();
        let header = Header::parse(&file).expect("parse");
        let sizes = from_header(&header, &file, 100).expect("sizes");
        // 100 tokens × 1 kv head × (4 + 4) × 2 bytes of cache per layer.
        assert_eq!(sizes.layer, vec![64 + 1600, 32 + 1600]);
        assert_eq!(sizes.head, 128);
        assert_eq!(
            sizes.output,
            32 + 128,
            "tied: the embedding is copied as the output"
        );
    }
}
