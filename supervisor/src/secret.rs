//! Random secrets and their hex form: the dashboard's session ids, CSRF and API tokens, and the
//! engine's per-launch control key all come from here.

/// 32 random bytes from the OS.
pub fn random_256() -> Result<[u8; 32], String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("the OS random source failed: {e}"))?;
    Ok(bytes)
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
