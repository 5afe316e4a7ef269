//! Builds the flashable Raspberry Pi 5 image from its declarative definition
//! (`image/appliance-rpi5.toml`) and boots it under QEMU: [`definition`] (the typed, checked
//! definition; config.txt comes from the shared `config-txt` crate), [`layout`] (the MBR partition
//! table), [`mirror`] (the Debian mirror from the host's apt sources), [`pipeline`] (cached
//! layers → disk image), [`qemu`] (the boot smoke test), [`stamped`] (the box identity it stamps and checks). The `appliance-image` binary is a thin
//! CLI over them.

pub mod definition;
pub mod layout;
pub mod mirror;
pub mod pipeline;
pub mod qemu;
pub mod run;
pub mod stamped;
