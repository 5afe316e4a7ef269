//! The per-launch control key: the supervisor's own requests to the engine (the health probe's
//! completion, the dashboard's "try it" box) carry it, and the engine serves them in a lane of
//! their own, never refused for a user queue that is full, so a busy box does not look dead.
//!
//! A fresh key is made for every launch and reaches the engine only through its environment:
//! never on its command line (which every local user can read in `/proc`), never in a log or in
//! the published state.

use std::fmt;

/// The environment variable the engine reads its key from.
pub const ENV: &str = "ENGINE_CONTROL_KEY";
/// The request header that carries it.
pub const HEADER: &str = "X-Engine-Control";

/// 32 random bytes in hex. `Debug` does not show it, so it cannot leak into a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlKey(String);

impl ControlKey {
    /// A fresh key from the OS random source.
    pub fn generate() -> Result<ControlKey, String> {
        let bytes = provision::secrets::random_256()
            .map_err(|e| format!("not started: making its control key: {e}"))?;
        Ok(ControlKey(hex::encode(bytes)))
    }

    /// The key itself, for the environment variable and the header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ControlKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_hex_and_never_shown() {
        let a = ControlKey::generate().expect("key");
        let b = ControlKey::generate().expect("key");
        assert_eq!(a.as_str().len(), 64);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
    }
}
