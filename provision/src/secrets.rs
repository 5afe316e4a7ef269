//! Making the secrets a fleet file holds only hashes of: an Argon2id password hash and an API
//! token with its SHA-256. The supervisor's `dashboard hash-password` / `new-token` and tests
//! that provision boxes make them here.

use argon2::PasswordHasher;
use argon2::password_hash::SaltString;
use sha2::{Digest, Sha256};

/// An Argon2id PHC string for `password` with a fresh random salt (the crate's default cost).
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| format!("the OS random source failed: {e}"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("cannot hash the password: {e}"))
}

/// 256 random bits from the OS: API tokens here, and the supervisor's session ids, CSRF tokens
/// and the engine's control key.
pub fn random_256() -> Result<[u8; 32], String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("the OS random source failed: {e}"))?;
    Ok(bytes)
}

/// A fresh API token (256 random bits, hex) and its SHA-256 (hex), which is all a box keeps.
pub fn new_token() -> Result<(String, String), String> {
    let token = hex::encode(random_256()?);
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    Ok((token, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_argon2id_and_tokens_fresh() {
        let a = hash_password("correct horse").expect("hash");
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert_ne!(a, hash_password("correct horse").expect("hash"), "salted");
        let (token, digest) = new_token().expect("token");
        assert_eq!(token.len(), 64);
        assert_eq!(digest, hex::encode(Sha256::digest(token.as_bytes())));
        assert_ne!(token, new_token().expect("token").0);
        a.parse::<crate::values::PasswordHash>()
            .expect("a fleet file accepts it");
    }
}
