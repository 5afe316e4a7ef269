//! Qwen 3.5's Gated DeltaNet layer, as llama.cpp 11434 computes it on the CPU
//! (`src/models/qwen35.cpp`, the fused `ggml_gated_delta_net` op): the input projected to
//! queries, keys and values (one matrix), a causal depthwise convolution over the last
//! `conv_kernel` rows with SiLU, queries and keys L2-normalised per head, and per value head a
//! `head_width`² state updated by the delta rule with a decay and a write strength per token.
//! The output is normed per head, gated by SiLU of a second projection, and projected back.
//!
//! The state (convolution rows and delta-rule matrices) is the sequence's memory instead of
//! keys and values: it lives in the [`KvCache`](super::KvCache) as a [`Recurrent`] per layer,
//! and a pass continues it from exactly where the last one stopped.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::hparams::DeltaShape;
use super::layers::{rms_norm, rms_scale, sigmoid};
use super::{Hparams, Work};
use crate::kernels::{self, Exec, Matrix, Product};

/// One Gated DeltaNet layer's weights.
pub(super) struct DeltaNet<'a> {
    /// Queries, keys and values of the convolution's input (`attn_qkv`).
    pub qkv: Matrix<'a>,
    /// The output gate before its SiLU (`attn_gate`).
    pub gate: Matrix<'a>,
    /// Write strength per value head, before its sigmoid (`ssm_beta`).
    pub beta: Matrix<'a>,
    /// Decay per value head, before softplus (`ssm_alpha`).
    pub alpha: Matrix<'a>,
    /// Convolution taps, `conv_kernel` per channel, the oldest row's first (`ssm_conv1d`).
    pub conv: Vec<f32>,
    /// Bias of the decay's input (`ssm_dt.bias`).
    pub dt_bias: Vec<f32>,
    /// The decay's rate, −exp(A_log) as the converter stores it (`ssm_a`).
    pub a: Vec<f32>,
    /// Per-head norm of the output (`ssm_norm`).
    pub norm: Vec<f32>,
    /// Projection back to the embedding (`ssm_out`).
    pub out: Matrix<'a>,
}

/// One sequence's state in one Gated DeltaNet layer.
#[derive(Clone, Default)]
pub(super) struct Recurrent {
    /// The convolution's last `conv_kernel − 1` input rows, oldest first (`channels` each).
    conv: Vec<f32>,
    /// Per value head, its state with one row per value dimension (`head_width` wide, over
    /// the key dimensions), as ggml lays it out.
    state: Vec<f32>,
}

impl Recurrent {
    /// The state of a sequence that has seen nothing, its pages written now: zeroed pages
    /// from the system would fault in during the first token instead (48 MiB for 4B).
    pub fn new(d: &DeltaShape) -> Recurrent {
        let written = |n: usize| {
            let mut v = Vec::with_capacity(n);
            v.resize(n, 0.0);
            v
        };
        Recurrent {
            conv: written(d.conv_floats()),
            state: written(d.state_floats()),
        }
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        4 * (self.conv.len() + self.state.len())
    }

    /// Back to the state of a sequence that has seen nothing.
    pub fn clear(&mut self) {
        self.conv.fill(0.0);
        self.state.fill(0.0);
    }
}

/// Every recurrent layer's state at one position.
#[derive(Clone)]
pub(super) struct Checkpoint {
    /// Positions taken in.
    pub at: usize,
    layers: Vec<Recurrent>,
}

impl Checkpoint {
    pub fn of(at: usize, layers: &[Recurrent]) -> Checkpoint {
        Checkpoint {
            at,
            layers: layers.to_vec(),
        }
    }

    /// Puts the kept state back into `layers`.
    pub fn restore(&self, layers: &mut [Recurrent]) {
        for (to, from) in layers.iter_mut().zip(&self.layers) {
            to.conv.copy_from_slice(&from.conv);
            to.state.copy_from_slice(&from.state);
        }
    }

    /// Keeps `layers` instead (same shapes: the buffers are reused).
    fn restore_from(&mut self, layers: &[Recurrent]) {
        for (to, from) in self.layers.iter_mut().zip(layers) {
            to.conv.copy_from_slice(&from.conv);
            to.state.copy_from_slice(&from.state);
        }
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(Recurrent::bytes).sum()
    }
}

/// A rollback point: the recurrent state at one position, and the recurrence inputs of the
/// tokens after it, per layer and token: the convolution's input row, its output (queries,
/// keys, values), then the decay and write strength of each value head. From these the state
/// after any of those tokens is rebuilt without running the model again.
#[derive(Clone, Default)]
pub(super) struct Journal {
    /// The state where the record starts (kept after a stop for its buffers).
    base: Option<Checkpoint>,
    /// Whether there is a record (from `base`).
    live: bool,
    /// Tokens recorded.
    tokens: usize,
    /// Whether the next pass goes on recording.
    recording: bool,
    layers: Vec<Vec<f32>>,
}

impl Journal {
    /// Starts a record at position `at`, where the state is `layers` (what was recorded
    /// before is dropped; its buffers are reused).
    pub fn start(&mut self, at: usize, layers: &[Recurrent]) {
        match &mut self.base {
            Some(base) if base.layers.len() == layers.len() => {
                base.at = at;
                base.restore_from(layers);
            }
            _ => self.base = Some(Checkpoint::of(at, layers)),
        }
        self.live = true;
        self.tokens = 0;
        self.recording = true;
        self.layers.iter_mut().for_each(Vec::clear);
    }

    /// Drops the record (its buffers stay for the next).
    pub fn stop(&mut self) {
        self.live = false;
        self.recording = false;
        self.tokens = 0;
    }

    /// The position the record starts at, if there is one.
    pub fn from(&self) -> Option<usize> {
        self.base.as_ref().filter(|_| self.live).map(|b| b.at)
    }

    /// The furthest position at or before `wanted` it can rebuild, if it starts at or before.
    pub fn reaches(&self, wanted: usize) -> Option<usize> {
        let from = self.from().filter(|&from| from <= wanted)?;
        Some(from + (wanted - from).min(self.tokens))
    }

    /// Whether a pass of `n` tokens from `first` is recorded (it continues the record and
    /// keeps it short); a pass that is not ends the recording.
    pub fn takes(&mut self, first: usize, n: usize) -> bool {
        let continues = self.from().is_some_and(|from| from + self.tokens == first);
        self.recording &= continues && self.tokens + n <= super::ROLLBACK_TOKENS;
        self.recording
    }

    /// The record of layer `il` to append a pass's tokens to.
    pub fn layer(&mut self, il: usize) -> &mut Vec<f32> {
        if self.layers.len() <= il {
            self.layers.resize_with(il + 1, Vec::new);
        }
        &mut self.layers[il]
    }

    /// Counts a recorded pass's tokens.
    pub fn recorded(&mut self, n: usize) {
        self.tokens += n;
    }

    pub fn bytes(&self) -> usize {
        let base = self.base.as_ref().map_or(0, Checkpoint::bytes);
        base + self.layers.iter().map(|l| 4 * l.capacity()).sum::<usize>()
    }

    /// Rebuilds in `layers` the state at `wanted` (which [`Journal::reaches`] gave): its
    /// base, then the recorded recurrence up to there.
    pub fn replay(
        &self,
        wanted: usize,
        d: Option<DeltaShape>,
        layers: &mut [Recurrent],
        isa: kernels::Isa,
    ) {
        let (Some(d), Some(base)) = (d, &self.base) else {
            return;
        };
        base.restore(layers);
        let k = wanted.saturating_sub(base.at).min(self.tokens);
        let (channels, heads, width) = (d.channels(), d.v_heads, d.head_width);
        let key_dim = d.key_dim();
        let record = 2 * channels + 2 * heads;
        let scale = 1.0 / (width as f32).sqrt();
        let mut out = vec![0f32; width];
        for (state, log) in layers.iter_mut().zip(&self.layers) {
            if state.bytes() == 0 || log.len() < k * record {
                continue;
            }
            for entry in log.chunks_exact(record).take(k) {
                let (raw, rest) = entry.split_at(channels);
                let (row, gates) = rest.split_at(channels);
                let (decay, beta) = gates.split_at(heads);
                for (head, s) in state.state.chunks_exact_mut(width * width).enumerate() {
                    let kh = head % d.k_heads;
                    let q = &row[kh * width..(kh + 1) * width];
                    let kk = &row[key_dim + kh * width..key_dim + (kh + 1) * width];
                    let v = &row[2 * key_dim + head * width..2 * key_dim + (head + 1) * width];
                    let gates = (decay[head], beta[head], scale);
                    kernels::delta_step(s, (q, kk, v), gates, &mut out, isa);
                }
                // The kept convolution rows move up by one: the token's input is the newest.
                state.conv.copy_within(channels.., 0);
                let newest = state.conv.len() - channels;
                state.conv[newest..].copy_from_slice(raw);
            }
        }
    }
}

/// `x ← silu(x)` (ggml's vectorised exponential, as its SiLU op): silu·1 is silu exactly.
fn silu(x: &mut [f32], isa: kernels::Isa) {
    const ONES: [f32; 256] = [1.0; 256];
    for chunk in x.chunks_mut(ONES.len()) {
        kernels::silu_mul(chunk, &ONES[..chunk.len()], isa);
    }
}

/// `x ← x / ‖x‖`, built as ggml builds it: an RMS norm with eps/n, then a scale by 1/√n.
fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let scale = rms_scale(x, eps / n);
    let shrink = 1.0 / n.sqrt();
    x.iter_mut().for_each(|v| *v = *v * scale * shrink);
}

/// Runs the layer on the normed inputs `w.cur` of `n` tokens, continuing `state`; the
/// projected output goes to `w.proj`. With `record`, each token's recurrence inputs are
/// appended to it (see [`Journal`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn mix(
    h: &Hparams,
    d: &DeltaShape,
    net: &DeltaNet<'_>,
    state: &mut Recurrent,
    record: Option<&mut Vec<f32>>,
    exec: &Exec,
    w: &mut Work,
    n: usize,
) -> Result<(), String> {
    let isa = exec.isa;
    let (channels, key_dim, value_dim) = (d.channels(), d.key_dim(), d.value_dim());
    let (heads, width, taps) = (d.v_heads, d.head_width, d.conv_kernel);
    let history = taps - 1;
    // The convolution's window: the kept rows, then this pass's (the input projection writes
    // straight after them).
    w.mixed.resize((history + n) * channels, 0.0);
    w.mixed[..history * channels].copy_from_slice(&state.conv);
    w.z.resize(n * value_dim, 0.0);
    w.beta.resize(n * heads, 0.0);
    w.decay.resize(n * heads, 0.0);
    kernels::matmul(
        &mut [
            Product {
                w: &net.qkv,
                out: &mut w.mixed[history * channels..],
            },
            Product {
                w: &net.gate,
                out: &mut w.z,
            },
            Product {
                w: &net.beta,
                out: &mut w.beta,
            },
            Product {
                w: &net.alpha,
                out: &mut w.decay,
            },
        ],
        &w.cur,
        n,
        exec,
        &mut w.scratch,
    )?;
    // As ggml: β = σ(x), g = softplus(x + dt_bias)·a, the decay e^g.
    w.beta.iter_mut().for_each(|b| *b = sigmoid(*b));
    for row in w.decay.chunks_exact_mut(heads) {
        for ((g, bias), a) in row.iter_mut().zip(&net.dt_bias).zip(&net.a) {
            let x = *g + bias;
            let softplus = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
            *g = (softplus * a).exp();
        }
    }
    // The convolution per channel over each token's window, oldest row first, then SiLU; the
    // newest rows become the kept ones.
    w.conv_out.resize(n * channels, 0.0);
    for (t, out) in w.conv_out.chunks_exact_mut(channels).enumerate() {
        for (c, (o, taps)) in out.iter_mut().zip(net.conv.chunks_exact(taps)).enumerate() {
            let mut sum = 0f32;
            for (j, tap) in taps.iter().enumerate() {
                sum += w.mixed[(t + j) * channels + c] * tap;
            }
            *o = sum;
        }
        silu(out, isa);
        let (q, k) = out[..2 * key_dim].split_at_mut(key_dim);
        for head in q.chunks_exact_mut(width).chain(k.chunks_exact_mut(width)) {
            l2_norm(head, h.rms_eps);
        }
    }
    state
        .conv
        .copy_from_slice(&w.mixed[n * channels..(n + history) * channels]);
    if let Some(record) = record {
        for t in 0..n {
            let raw = (history + t) * channels;
            record.extend_from_slice(&w.mixed[raw..raw + channels]);
            record.extend_from_slice(&w.conv_out[t * channels..(t + 1) * channels]);
            record.extend_from_slice(&w.decay[t * heads..(t + 1) * heads]);
            record.extend_from_slice(&w.beta[t * heads..(t + 1) * heads]);
        }
    }

    // The delta rule per value head, token after token; heads run on the threads. Value head
    // j reads key head j mod k_heads (the converter tiles them so).
    w.by_head.resize(n * value_dim, 0.0);
    let scale = 1.0 / (width as f32).sqrt();
    let states: Vec<Mutex<&mut [f32]>> = state
        .state
        .chunks_exact_mut(width * width)
        .map(Mutex::new)
        .collect();
    let outs: Vec<Mutex<&mut [f32]>> = w
        .by_head
        .chunks_exact_mut(n * width)
        .map(Mutex::new)
        .collect();
    let next = AtomicUsize::new(0);
    let (conv_out, beta, decay) = (&w.conv_out, &w.beta, &w.decay);
    exec.pool.run(&|_| {
        loop {
            let head = next.fetch_add(1, Ordering::Relaxed);
            if head >= heads {
                return;
            }
            // A lock is only ever poisoned by a panic, which the pool raises again anyway.
            let mut s = states[head].lock().unwrap_or_else(|e| e.into_inner());
            let mut out = outs[head].lock().unwrap_or_else(|e| e.into_inner());
            let kh = head % d.k_heads;
            for (t, out) in out.chunks_exact_mut(width).enumerate() {
                let row = &conv_out[t * channels..(t + 1) * channels];
                let q = &row[kh * width..(kh + 1) * width];
                let k = &row[key_dim + kh * width..key_dim + (kh + 1) * width];
                let v = &row[2 * key_dim + head * width..2 * key_dim + (head + 1) * width];
                let at = t * heads + head;
                kernels::delta_step(&mut s, (q, k, v), (decay[at], beta[at], scale), out, isa);
            }
        }
    });
    drop((states, outs));
    // Back to token order, each head normed and gated by SiLU(z), then projected.
    w.attn.resize(n * value_dim, 0.0);
    for (head, by_token) in w.by_head.chunks_exact(n * width).enumerate() {
        for (t, o) in by_token.chunks_exact(width).enumerate() {
            let at = t * value_dim + head * width;
            let y = &mut w.attn[at..at + width];
            y.copy_from_slice(o);
            rms_norm(y, &net.norm, h.rms_eps);
        }
    }
    kernels::silu_mul(&mut w.z, &w.attn, isa);
    kernels::matmul(
        &mut [Product {
            w: &net.out,
            out: &mut w.proj,
        }],
        &w.z,
        n,
        exec,
        &mut w.scratch,
    )
}
