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
pub fn new_token(scopes: &[String]) -> ExitCode {
    match provision::secrets::new_token() {
        Ok((token, digest)) => {
            let mut words: Vec<&str> = Vec::new();
            for s in scopes {
                if !words.contains(&s.as_str()) {
                    words.push(s);
                }
            }
            let entry = if words.is_empty() {
                digest
            } else {
                format!("{}:{digest}", words.join("+"))
            };
            println!("token {token}");
            println!("sha256 {entry}");
            eprintln!(
                "give the token to the client (Authorization: Bearer TOKEN); put only the sha256 \
                 line's value in [dashboard] api_token_sha256{}",
                if words.is_empty() {
                    " (it may do everything: narrow it with --scope read for a scraper)"
                } else {
                    ""
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
