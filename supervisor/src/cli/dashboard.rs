//! `supervisor dashboard hash-password` and `supervisor dashboard new-token`: the values an
//! installer puts in `[dashboard]`.

use std::process::ExitCode;

use dashboard::auth;

use super::{EXIT_BAD_INPUT, EXIT_FAILED};

/// Reads a password from stdin and prints its Argon2id PHC string for `password_hash`.
pub fn hash_password() -> ExitCode {
    let hashed = auth::password_from(std::io::stdin().lock()).and_then(|p| auth::hash_password(&p));
    match hashed {
        Ok(phc) => {
            println!("{phc}");
            eprintln!("put it in [dashboard] password_hash = \"...\"");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// Prints a fresh API token and its SHA-256 for `api_token_sha256`.
pub fn new_token() -> ExitCode {
    match provision::secrets::new_token() {
        Ok((token, digest)) => {
            println!("token {token}");
            println!("sha256 {digest}");
            eprintln!(
                "give the token to the client (Authorization: Bearer TOKEN); put only the sha256 in [dashboard] api_token_sha256"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
