//! `supervisor status`: every tuning step and facts about the board.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::report;

use super::{bad_input, load};

/// `supervisor --root DIR [--config FILE] status [--json]`.
pub fn status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let status = report::read(&board, &config);
    if json {
        match serde_json::to_string_pretty(&status.to_wire()) {
            Ok(text) => println!("{text}"),
            Err(e) => return bad_input(format!("cannot encode status: {e}")),
        }
    } else {
        print!("{}", report::facts_text(&status.board, status.simulated));
        print!("{}", report::provision_text(&status.provision));
        print!("{}", report::clock_text(&status.clock));
        let m = &status.model;
        println!(
            "model: {} {} {}",
            m.id,
            m.state,
            m.path.as_deref().unwrap_or("")
        );
        if let Some(draft) = &m.draft {
            println!("       draft head {draft} (speculation: {})", m.speculation);
        }
        println!("       {}", m.reason);
        let e = &status.engine;
        let state = report::word(e.state);
        println!(
            "engine: {state} {} (restarts {}{})",
            e.url.as_deref().unwrap_or(""),
            e.restarts,
            e.last_exit
                .as_deref()
                .map(|x| format!(", last exit: {x}"))
                .unwrap_or_default()
        );
        println!("        {}", e.reason);
        if let Some(c) = &status.cluster {
            println!(
                "cluster: {} ({}): {} — {}",
                c.name, c.role, c.state, c.reason
            );
            for m in &c.members {
                let handshake = m
                    .handshake_age_s
                    .map_or("no handshake yet".to_string(), |s| {
                        format!("handshake {s} s ago")
                    });
                println!("         {} {} {} ({handshake})", m.role, m.name, m.address);
            }
            for s in &c.layers {
                println!(
                    "         {} holds layers {}..{}{} ({} of {} MiB)",
                    s.member,
                    s.first_layer,
                    s.first_layer + s.layers,
                    if s.output { " and the output" } else { "" },
                    s.mib,
                    s.budget_mib
                );
            }
        }
        print!("{}", report::overclock_text(&status.overclock));
        print!("{}", report::update_text(&status.update));
        println!();
        print!("{}", report::steps_table(&status.steps));
    }
    ExitCode::SUCCESS
}
