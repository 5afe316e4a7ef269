//! What every draft source must keep: the generated tokens.

use engine::generate::{Budget, generate};
use engine::model::{DraftHead, Model};
use engine::sampler::{Sampler, Sampling};
use engine::speculate::{Costs, MAX_DRAFT, Speculation};

/// Greedy and seeded generation after the tiny prompt give the same tokens with `head`
/// drafting as without, and `head` drafts (`label` names the case in failures).
pub fn change_no_token(model: &Model<'_>, head: &DraftHead<'_>, label: &str) {
    let prompt = test_support::tiny::prompt();
    // Passes as cheap as steps, so the source drafts at every step it is trusted at all.
    let free = Costs::from_seconds(&[1.0; MAX_DRAFT + 1]);
    for sampling in [
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        Sampling {
            temperature: 1.0,
            seed: 7,
            ..Sampling::default()
        },
    ] {
        let run = |speculate: bool| {
            let mut sampler = Sampler::new(sampling.clone());
            let mut speculation = speculate.then(|| Speculation::new(3, 0, free.clone()));
            let (tokens, _) = generate(
                model,
                &prompt,
                Budget {
                    limit: 40,
                    context: 256,
                    threads: 2,
                },
                &mut sampler,
                &[],
                speculation.as_mut(),
                speculate.then_some(head),
                &mut |_| {},
            )
            .expect("generate");
            (tokens, speculation.map_or((0, 0), |s| s.drafts()))
        };
        let (plain, _) = run(false);
        let (drafted, (n, _)) = run(true);
        assert_eq!(plain, drafted, "{label} {sampling:?}");
        assert!(n > 0, "{label}: nothing drafted ({sampling:?})");
    }
}
