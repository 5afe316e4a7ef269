//! RAUC's custom bootloader backend (`[handlers] bootloader-custom-backend` in its
//! `system.conf`): RAUC runs `supervisor update backend COMMAND [SLOT] [STATE]` and reads one
//! line from standard output. The firmware has no slot states of its own, so "primary" and
//! "good/bad" are the supervisor's record and the boot files: `set-primary` of the other slot
//! arms a tryboot trial of it, `set-state good` of the slot on trial commits it.

use super::slot::{self, Slot};
use crate::board::Board;
use crate::config::Config;

/// One call from RAUC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Which slot boots next.
    GetPrimary,
    /// Make this slot boot next.
    SetPrimary(Slot),
    /// Whether a slot is good or bad.
    GetState(Slot),
    /// Mark a slot good (`true`) or bad.
    SetState(Slot, bool),
    /// The slot running now.
    GetCurrent,
}

impl Call {
    /// Parses RAUC's arguments.
    pub fn parse(args: &[String]) -> Result<Call, String> {
        let slot = |i: usize| {
            args.get(i)
                .ok_or_else(|| format!("`{}` needs a slot name (A or B)", args[0]))
                .and_then(|s| Slot::from_bootname(s))
        };
        let Some(command) = args.first() else {
            return Err("no backend command given (get-primary, set-primary, get-state, set-state, get-current)".into());
        };
        let call = match command.as_str() {
            "get-primary" => Call::GetPrimary,
            "set-primary" => Call::SetPrimary(slot(1)?),
            "get-state" => Call::GetState(slot(1)?),
            "set-state" => {
                let good = match args.get(2).map(String::as_str) {
                    Some("good") => true,
                    Some("bad") => false,
                    other => {
                        return Err(format!(
                            "set-state needs `good` or `bad`, not {}",
                            other.unwrap_or("nothing")
                        ));
                    }
                };
                Call::SetState(slot(1)?, good)
            }
            "get-current" => Call::GetCurrent,
            other => {
                return Err(format!(
                    "unknown backend command `{other}` (get-primary, set-primary, get-state, set-state, get-current)"
                ));
            }
        };
        let expected = match call {
            Call::GetPrimary | Call::GetCurrent => 1,
            Call::SetPrimary(_) | Call::GetState(_) => 2,
            Call::SetState(..) => 3,
        };
        if args.len() != expected {
            return Err(format!(
                "`{command}` takes {} argument(s), got {}",
                expected - 1,
                args.len() - 1
            ));
        }
        Ok(call)
    }
}

fn booted(board: &Board) -> Result<Slot, String> {
    slot::booted(board)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "this boot names no slot (no rauc.slot= on the kernel command line)".into())
}

/// Carries out one call; the `Ok` text is what RAUC reads (empty for the setters).
pub fn run(board: &Board, config: &Config, call: Call) -> Result<String, String> {
    match call {
        Call::GetCurrent => Ok(booted(board)?.to_string()),
        Call::GetPrimary => {
            if let Some(trial) = super::pending(board, config)? {
                return Ok(trial.slot.to_string());
            }
            Ok(super::committed(board)?
                .map_or_else(|| booted(board), Ok)?
                .to_string())
        }
        Call::GetState(s) => {
            let status = super::status(board, config);
            if let Some(e) = status.error {
                return Err(e);
            }
            Ok(status
                .slots
                .iter()
                .find(|x| x.slot == s)
                .map_or("good", |x| x.state)
                .to_string())
        }
        Call::SetPrimary(s) => {
            let running = booted(board)?;
            if s == running {
                super::cancel(board, config, "RAUC made the running slot primary again")?;
                return Ok(String::new());
            }
            super::arm(board, config, s).map(|_| String::new())
        }
        Call::SetState(s, good) => {
            let running = booted(board)?;
            let on_trial = super::pending(board, config)?.is_some_and(|t| t.slot == s);
            match (good, on_trial, s == running) {
                // RAUC marks the slot it is about to write bad; an armed trial of it is void.
                (false, true, false) => {
                    super::cancel(board, config, "RAUC is writing the slot again")?;
                    super::mark(board, config, s, true)?;
                }
                (false, _, true) if super::committed(board)? == Some(s) => {
                    return Err(format!(
                        "slot {s} is running and committed; it cannot be marked bad (install an update instead)"
                    ));
                }
                (false, true, true) => {
                    super::roll_back(board, config, "marked bad through RAUC")?;
                }
                (true, true, true) => {
                    super::commit(board, config, "marked good through RAUC")?;
                }
                (good, _, _) => super::mark(board, config, s, !good)?,
            }
            Ok(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Call, String> {
        Call::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn rauc_calls_parse_and_bad_ones_say_why() {
        assert_eq!(parse(&["get-primary"]), Ok(Call::GetPrimary));
        assert_eq!(parse(&["set-primary", "B"]), Ok(Call::SetPrimary(Slot::B)));
        assert_eq!(
            parse(&["set-state", "A", "bad"]),
            Ok(Call::SetState(Slot::A, false))
        );
        assert_eq!(parse(&["get-state", "B"]), Ok(Call::GetState(Slot::B)));
        assert!(
            parse(&[])
                .expect_err("refused")
                .contains("no backend command")
        );
        assert!(
            parse(&["set-primary"])
                .expect_err("refused")
                .contains("needs a slot")
        );
        assert!(
            parse(&["set-primary", "C"])
                .expect_err("refused")
                .contains("unknown slot")
        );
        assert!(
            parse(&["set-state", "A", "meh"])
                .expect_err("refused")
                .contains("good` or `bad")
        );
        assert!(
            parse(&["get-current", "A"])
                .expect_err("refused")
                .contains("takes 0")
        );
        assert!(
            parse(&["reboot"])
                .expect_err("refused")
                .contains("unknown backend command")
        );
    }
}
