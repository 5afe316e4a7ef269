//! Replays greedy answers through the n-gram planner as built ([`Speculation`]), with pass
//! costs given rather than timed: how much of what `bench/spec-bound.py` says is possible the
//! planner gets on those answers, free of this machine's noise.
//!
//! Reads JSON on stdin, `{"cost": [c1, c2, …], "chats": [{"prompt": [ids], "answer": [ids]}]}`
//! (`cost[m - 1]`: a pass of `m` tokens, in any unit), and prints one line of JSON per
//! chat: the speed-up over plain decoding, the passes, and the drafted and accepted tokens.

use std::io::Read;

use engine::speculate::{Costs, MAX_DRAFT, Speculation};
use serde::Deserialize;

#[derive(Deserialize)]
struct Chat {
    prompt: Vec<u32>,
    answer: Vec<u32>,
}

#[derive(Deserialize)]
struct Input {
    cost: Vec<f64>,
    chats: Vec<Chat>,
}

fn main() -> Result<(), String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("reading stdin: {e}"))?;
    let input: Input =
        serde_json::from_str(&text).map_err(|e| format!("stdin is not the replay's JSON: {e}"))?;
    if input.cost.len() < MAX_DRAFT + 1 || input.cost.iter().any(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(format!(
            "cost needs {} positive pass costs (passes of 1 to {} tokens)",
            MAX_DRAFT + 1,
            MAX_DRAFT + 1
        ));
    }
    for (n, chat) in input.chats.iter().enumerate() {
        let Some((&first, rest)) = chat.answer.split_first() else {
            return Err(format!("chat {n} has an empty answer"));
        };
        let mut speculation = Speculation::new(MAX_DRAFT, 0, Costs::from_seconds(&input.cost));
        let mut history = chat.prompt.clone();
        history.push(first);
        let (mut done, mut spent, mut passes) = (0, 0.0, 0);
        while done < rest.len() {
            let drafts = speculation.next(&history, rest.len() - done - 1).to_vec();
            let mut accepted = 0;
            for (drafted, wanted) in drafts.iter().zip(&rest[done..]) {
                speculation.checked(drafted == wanted);
                if drafted != wanted {
                    break;
                }
                accepted += 1;
            }
            let cost = input.cost[drafts.len()];
            spent += cost;
            passes += 1;
            // Seconds in any unit: the planner compares them with its one-token passes'.
            speculation.timed(drafts.len() + 1, cost);
            history.extend_from_slice(&rest[done..done + accepted + 1]);
            done += accepted + 1;
        }
        let (drafted, accepted) = speculation.drafts();
        println!(
            "{}",
            serde_json::json!({
                // Plain decoding: one pass of one token per token after the first.
                "speedup": rest.len() as f64 * input.cost[0] / spent.max(f64::MIN_POSITIVE),
                "passes": passes,
                "drafted": drafted,
                "accepted": accepted,
            })
        );
    }
    Ok(())
}
