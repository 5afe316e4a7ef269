//! The supervisor's core: the state machines of the daemon that owns a Raspberry Pi 5 LLM box.
//!
//! It brings the board into the tuned state (governor, the engine's cgroup, swap, bootloader
//! SDRAM interleave) and proves it by reading back effective values ([`tune`]); everything it
//! reads or writes on the machine goes through one root ([`board`], its own crate), so a simulated
//! board tree (crate `board-sim`, which only tests and the `supervisor` binary's `sim` feature
//! use) stands in for a real Pi. It lets the engine run only weights that match an approved
//! manifest ([`model`], on the `weights` crate), and launches, probes and restarts the engine on
//! them ([`engine`]). It finds the highest clock the board computes right at, one tryboot trial at
//! a time under the hardware watchdog ([`overclock`]). It takes signed A/B system updates through
//! RAUC, commits a new slot only once it is healthy and otherwise lets the firmware fall back
//! ([`update`]). It applies fleet provisioning ([`provision`]) and reports the box's status
//! ([`report`], in the `wire` crate's types).
//!
//! This crate returns typed results and never prints, picks an exit status or serves HTTP: the
//! `dashboard` crate serves the web dashboard over it, and the `supervisor` binary is the daemon
//! (which wires both together) and the command line.

/// The machine itself: the `board` crate, under the name the supervisor's modules use.
pub use ::board;
/// The bootloader's formats, from the `board` crate.
pub use ::board::bootloader;
pub mod bootfiles;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod metrics;
pub mod model;
pub mod models;
pub mod overclock;
pub mod pid;
pub mod provision;
pub mod report;
pub mod state_file;
pub mod systemd;
pub mod tune;
pub mod update;
pub mod weights_ops;
