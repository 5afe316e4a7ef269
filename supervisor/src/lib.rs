//! The Appliance supervisor's daemon: `supervisor run` wires the core's state machines
//! (`supervisor-core`: tuning, the engine's supervision, overclock and update trials) to the web
//! dashboard (`dashboard`) on one runtime. The command line (`src/main.rs`, `src/cli/`) sits on
//! top and is the only part that prints or picks an exit status.

pub mod daemon;
