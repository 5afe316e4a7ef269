//! `supervisor dashboard hash-password` and `supervisor dashboard new-token`: the values an
//! installer puts in `[dashboard]`.

use std::io::Read;
use std::process::ExitCode;

use supervisor::dashboard::auth;

use super::{EXIT_BAD_INPUT, EXIT_FAILED};

/// Longest password read from stdin; anything longer is a mistake (a file piped in).
const MAX_PASSWORD: usize = 1024;

/// The password from stdin without its final line break.
fn password_from(mut input: impl Read) -> Result<String, String> {
    let mut bytes = Vec::new();
    input
        .by_ref()
        .take(MAX_PASSWORD as u64 + 3)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let mut text =
        String::from_utf8(bytes).map_err(|_| "the password is not valid UTF-8".to_string())?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err("empty password: type it on stdin, e.g. `read -rs PW; printf '%s' \"$PW\" | supervisor dashboard hash-password`".into());
    }
    if text.len() > MAX_PASSWORD {
        return Err(format!("the password is longer than {MAX_PASSWORD} bytes"));
    }
    Ok(text)
}

/// Reads a password from stdin and prints its Argon2id PHC string for `password_hash`.
pub fn hash_password() -> ExitCode {
    let hashed = password_from(std::io::stdin().lock()).and_then(|p| auth::hash_password(&p));
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

#[cfg(test)]
mod tests {
    use super::password_from;

    #[test]
    fn the_final_line_break_is_not_part_of_the_password_and_empty_is_refused() {
        assert_eq!(password_from(&b"s3cret\n"[..]).expect("ok"), "s3cret");
        assert_eq!(password_from(&b"s3cret\r\n"[..]).expect("ok"), "s3cret");
        assert_eq!(
            password_from(&b" two words "[..]).expect("ok"),
            " two words "
        );
        assert!(password_from(&b"\n"[..]).is_err());
        assert!(password_from(&b""[..]).is_err());
        assert!(password_from(&[b'x'; 2000][..]).is_err());
    }
}
