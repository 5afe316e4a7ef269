//! A mixture-of-experts FFN (Qwen 3 MoE), computed as llama.cpp computes it: each token's router
//! logits through a softmax, its `k` most probable experts, their probabilities renormalised to
//! sum to one; each chosen expert's SiLU-gated FFN output scaled by its weight, and the `k`
//! outputs added in the order chosen. The tokens of a pass are grouped by expert, so an expert's
//! rows are read once per pass for all its tokens, and an expert no token chose is not read at
//! all (its pages of the mapped file are never touched).

use super::{Hparams, Work};
use crate::kernels::{self, Exec, Matrix, Product};

/// One layer's routed experts.
pub(super) struct Experts<'a> {
    /// Router: one row per expert.
    pub router: Matrix<'a>,
    /// Each expert's gate, up and down matrices (its rows of the 3-D expert tensors).
    pub gate: Vec<Matrix<'a>>,
    pub up: Vec<Matrix<'a>>,
    pub down: Vec<Matrix<'a>>,
    /// Qwen 3.5 MoE's shared expert, which every token goes through.
    pub shared: Option<Shared<'a>>,
}

/// A shared expert: a SiLU-gated FFN whose output is scaled per token by σ(gate · x).
pub(super) struct Shared<'a> {
    /// The per-token gate's weights (`ffn_gate_inp_shexp`).
    pub gate_inp: Vec<f32>,
    pub gate: Matrix<'a>,
    pub up: Matrix<'a>,
    pub down: Matrix<'a>,
}

/// Lower bound of the chosen probabilities' sum before dividing by it (llama.cpp's clamp).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// `w.proj = FFN(w.cur)` for the `n` tokens of a pass.
pub(super) fn ffn(
    h: &Hparams,
    experts: &Experts<'_>,
    exec: &Exec,
    w: &mut Work,
    n: usize,
) -> Result<(), String> {
    let (e, k) = (h.n_embd, h.n_expert_used);
    w.route.resize(n * h.n_expert, 0.0);
    kernels::matmul(
        &mut [Product {
            w: &experts.router,
            out: &mut w.route,
        }],
        &w.cur,
        n,
        exec,
        &mut w.scratch,
    )?;
    w.chosen.clear();
    for logits in w.route.chunks_exact_mut(h.n_expert) {
        choose(logits, k, &mut w.chosen);
    }
    if n == 1 && 2 * k <= kernels::MAX_PRODUCTS {
        one_token(h, experts, exec, w)?;
    } else {
        grouped(h, experts, exec, w, n)?;
    }
    for (t, proj) in w.proj[..n * e].chunks_exact_mut(e).enumerate() {
        let slots = &w.moe_out[t * k * e..(t + 1) * k * e];
        proj.copy_from_slice(&slots[..e]);
        for slot in slots.chunks_exact(e).skip(1) {
            for (p, s) in proj.iter_mut().zip(slot) {
                *p += s;
            }
        }
    }
    match &experts.shared {
        Some(shared) => shared_expert(h, shared, exec, w, n),
        None => Ok(()),
    }
}

/// Adds the shared expert's output, gated per token, to the routed experts' in `w.proj` (as
/// llama.cpp adds it after them).
fn shared_expert(
    h: &Hparams,
    shared: &Shared<'_>,
    exec: &Exec,
    w: &mut Work,
    n: usize,
) -> Result<(), String> {
    let (e, ff) = (h.n_embd, h.n_ff_shared);
    w.gate.resize(n * ff, 0.0);
    w.up.resize(n * ff, 0.0);
    kernels::matmul(
        &mut [
            Product {
                w: &shared.gate,
                out: &mut w.gate,
            },
            Product {
                w: &shared.up,
                out: &mut w.up,
            },
        ],
        &w.cur,
        n,
        exec,
        &mut w.scratch,
    )?;
    for (gate, up) in w.gate.chunks_exact_mut(ff).zip(w.up.chunks_exact(ff)) {
        kernels::silu_mul(gate, up, exec.isa);
    }
    w.moe_down.resize(n * e, 0.0);
    kernels::matmul(
        &mut [Product {
            w: &shared.down,
            out: &mut w.moe_down,
        }],
        &w.gate,
        n,
        exec,
        &mut w.scratch,
    )?;
    for ((proj, down), x) in w
        .proj
        .chunks_exact_mut(e)
        .zip(w.moe_down.chunks_exact(e))
        .zip(w.cur.chunks_exact(e))
    {
        let logit: f32 = shared.gate_inp.iter().zip(x).map(|(g, x)| g * x).sum();
        let gate = super::layers::sigmoid(logit);
        for (p, d) in proj.iter_mut().zip(down) {
            *p += d * gate;
        }
    }
    Ok(())
}

/// A batch: each expert's tokens gathered into one batch, so its rows are read once per pass.
fn grouped(
    h: &Hparams,
    experts: &Experts<'_>,
    exec: &Exec,
    w: &mut Work,
    n: usize,
) -> Result<(), String> {
    let (e, k, ff) = (h.n_embd, h.n_expert_used, h.n_ff);
    w.moe_in.resize(n * e, 0.0);
    w.moe_out.resize(n * k * e, 0.0);
    w.moe_down.resize(n * e, 0.0);
    for expert in 0..h.n_expert {
        // The (token, slot) pairs routed to this expert, gathered into one batch.
        let mut m = 0;
        for (pair, &(chosen, _)) in w.chosen.iter().enumerate() {
            if chosen as usize == expert {
                let t = pair / k;
                w.moe_in[m * e..(m + 1) * e].copy_from_slice(&w.cur[t * e..(t + 1) * e]);
                m += 1;
            }
        }
        if m == 0 {
            continue;
        }
        let (gate, up) = (&mut w.gate[..m * ff], &mut w.up[..m * ff]);
        kernels::matmul(
            &mut [
                Product {
                    w: &experts.gate[expert],
                    out: gate,
                },
                Product {
                    w: &experts.up[expert],
                    out: up,
                },
            ],
            &w.moe_in[..m * e],
            m,
            exec,
            &mut w.scratch,
        )?;
        for (g, u) in w.gate[..m * ff]
            .chunks_exact_mut(ff)
            .zip(w.up[..m * ff].chunks_exact(ff))
        {
            kernels::silu_mul(g, u, exec.isa);
        }
        kernels::matmul(
            &mut [Product {
                w: &experts.down[expert],
                out: &mut w.moe_down[..m * e],
            }],
            &w.gate[..m * ff],
            m,
            exec,
            &mut w.scratch,
        )?;
        let mut row = 0;
        for (pair, &(chosen, weight)) in w.chosen.iter().enumerate() {
            if chosen as usize == expert {
                let out = &mut w.moe_out[pair * e..(pair + 1) * e];
                let down = &w.moe_down[row * e..(row + 1) * e];
                for (o, d) in out.iter_mut().zip(down) {
                    *o = d * weight;
                }
                row += 1;
            }
        }
    }
    Ok(())
}

/// One token: its experts all read the same input, so every chosen expert's gate and up
/// products run in one parallel region (a region per product made the waits at region
/// boundaries a fifth of a token).
fn one_token(h: &Hparams, experts: &Experts<'_>, exec: &Exec, w: &mut Work) -> Result<(), String> {
    let (e, k, ff) = (h.n_embd, h.n_expert_used, h.n_ff);
    w.moe_gate.resize(k * ff, 0.0);
    w.moe_up.resize(k * ff, 0.0);
    w.moe_out.resize(k * e, 0.0);
    w.moe_down.resize(e, 0.0);
    let mut products: Vec<Product<'_, '_>> = w
        .chosen
        .iter()
        .zip(
            w.moe_gate
                .chunks_exact_mut(ff)
                .zip(w.moe_up.chunks_exact_mut(ff)),
        )
        .flat_map(|(&(expert, _), (gate, up))| {
            let expert = expert as usize;
            [
                Product {
                    w: &experts.gate[expert],
                    out: gate,
                },
                Product {
                    w: &experts.up[expert],
                    out: up,
                },
            ]
        })
        .collect();
    kernels::matmul(&mut products, &w.cur[..e], 1, exec, &mut w.scratch)?;
    drop(products);
    for ((g, u), (slot, &(expert, weight))) in w
        .moe_gate
        .chunks_exact_mut(ff)
        .zip(w.moe_up.chunks_exact(ff))
        .zip(w.chosen.iter().enumerate())
    {
        kernels::silu_mul(g, u, exec.isa);
        kernels::matmul(
            &mut [Product {
                w: &experts.down[expert as usize],
                out: &mut w.moe_down,
            }],
            g,
            1,
            exec,
            &mut w.scratch,
        )?;
        for (o, d) in w.moe_out[slot * e..(slot + 1) * e]
            .iter_mut()
            .zip(&w.moe_down)
        {
            *o = d * weight;
        }
    }
    Ok(())
}

/// Appends the `k` experts `logits` routes to, most probable first, with their weights: the
/// softmax's probabilities (exponentials summed in f64, as ggml sums them), renormalised over
/// the chosen. Ties go to the lower expert.
fn choose(logits: &mut [f32], k: usize, chosen: &mut Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for l in logits.iter_mut() {
        *l = (*l - max).exp();
        sum += f64::from(*l);
    }
    let scale = (1.0 / sum) as f32;
    logits.iter_mut().for_each(|p| *p *= scale);
    let from = chosen.len();
    for _ in 0..k {
        let best = logits
            .iter()
            .enumerate()
            .filter(|(i, _)| !chosen[from..].iter().any(|&(c, _)| c as usize == *i))
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map(|(i, &p)| (i as u32, p));
        chosen.extend(best);
    }
    let total: f64 = chosen[from..].iter().map(|&(_, p)| f64::from(p)).sum();
    let total = (total as f32).max(MIN_WEIGHT_SUM);
    for (_, p) in &mut chosen[from..] {
        *p /= total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_k_are_chosen_and_their_weights_sum_to_one() {
        let mut logits = vec![0.0, 2.0, -1.0, 2.0, 1.0];
        let mut chosen = Vec::new();
        choose(&mut logits, 3, &mut chosen);
        let ids: Vec<u32> = chosen.iter().map(|c| c.0).collect();
        // A tie goes to the lower expert.
        assert_eq!(ids, [1, 3, 4]);
        let sum: f32 = chosen.iter().map(|c| c.1).sum();
        assert!((sum - 1.0).abs() < 1e-6, "{sum}");
        // e² : e² : e¹ renormalised.
        let e = std::f32::consts::E;
        assert!((chosen[2].1 - e / (2.0 * e * e + e)).abs() < 1e-6);
        assert_eq!(chosen[0].1, chosen[1].1);
    }
}
