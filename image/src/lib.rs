//! Builds the flashable Raspberry Pi 5 image from its declarative definition
//! (`image/appliance-rpi5.toml`) and boots it under QEMU: [`definition`] (the typed, checked
//! definition; config.txt comes from the shared `config-txt` crate), [`layout`] (the MBR partition
//! table), [`bundle`] (RAUC's configuration and the signed update bundle), [`mirror`] (the Debian mirror from the host's apt sources), [`pipeline`] (cached
//! layers → disk image), [`qemu`] (the boot smoke test, the harness playing the Pi 5 firmware), [`qemu_update`]
//! (A/B updates end to end: commit, power cycle, rollback), [`stamped`] (the box identity it stamps and checks). The `appliance-image` binary is a thin
//! CLI over them.

pub mod bundle;
pub mod definition;
pub mod layout;
pub mod mirror;
pub mod pipeline;
pub mod qemu;
pub mod qemu_update;
pub mod run;
pub mod stamped;
