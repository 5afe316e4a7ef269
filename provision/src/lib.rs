//! Fleet provisioning files, parsed and checked; nothing here touches a machine.
//!
//! The operator keeps one **fleet file** (`fleet.toml`): a `[fleet]` name, a `generation` and
//! `[fleet.defaults]`, then one `[[box]]` per box overriding them. A box finds the same format
//! on its boot partition as **`appliance-provision.toml`**: stamped for one box
//! ([`FleetFile::stamp`]) or the whole fleet, each box taking its entry by board serial
//! ([`FleetFile::entry_for`]). Secrets are only ever hashes (Argon2 password, SHA-256 tokens,
//! the Wi-Fi PSK), and [`FleetFile::without_secrets`] is what a box leaves on the boot
//! partition once it has applied the file.

pub mod cluster;
pub mod enroll;
pub mod fleet;
pub mod secrets;
pub mod values;
pub mod wifi;

pub use fleet::{BoxSettings, Fleet, FleetFile, Network, Wifi};

/// The name of the provisioning file on a box's boot partition.
pub const PROVISION_FILE: &str = "appliance-provision.toml";
