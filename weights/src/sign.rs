//! ed25519 signatures over a manifest's exact bytes, kept beside it in `<manifest>.sig`.
//!
//! Signature file: `ed25519 <public key hex> <signature hex>`. Secret key file:
//! `appliance-ed25519-secret <seed hex>` (mode 0600). The box trusts the public keys in its
//! configuration; a present signature must verify with one of them, and with
//! `require_signature` an absent one is refused too.

use std::io::Read;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use crate::{Error, ErrorKind};

const SIG_TAG: &str = "ed25519";
const SECRET_TAG: &str = "appliance-ed25519-secret";

fn sig_error(message: String) -> Error {
    Error::new(ErrorKind::Signature, message)
}

fn bytes32(hex_text: &str, what: &str) -> Result<[u8; 32], Error> {
    hex::decode(hex_text)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| sig_error(format!("{what} must be 64 hex digits")))
}

/// A new key pair: the secret key file's text and the public key in hex.
pub fn keygen() -> Result<(String, String), Error> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| Error::io("reading /dev/urandom", e))?;
    let key = SigningKey::from_bytes(&seed);
    Ok((
        format!("{SECRET_TAG} {}\n", hex::encode(seed)),
        hex::encode(key.verifying_key().to_bytes()),
    ))
}

/// Signs `manifest` with the key in a secret key file's text; returns the signature file's text.
pub fn sign(manifest: &[u8], secret_file: &str) -> Result<String, Error> {
    let seed = secret_file
        .trim()
        .strip_prefix(SECRET_TAG)
        .map(str::trim)
        .ok_or_else(|| {
            sig_error(format!(
                "not a secret key file (it must start with {SECRET_TAG})"
            ))
        })?;
    let key = SigningKey::from_bytes(&bytes32(seed, "the secret key")?);
    let signature = key.sign(manifest);
    Ok(format!(
        "{SIG_TAG} {} {}\n",
        hex::encode(key.verifying_key().to_bytes()),
        hex::encode(signature.to_bytes())
    ))
}

/// The keys a box trusts and whether it insists on a signature.
#[derive(Debug, Clone)]
pub struct Trust {
    keys: Vec<VerifyingKey>,
    require: bool,
}

/// How a manifest's signature checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signed {
    /// Signed by this trusted key (hex).
    By(String),
    /// Not signed, which the box allows.
    Unsigned,
}

impl Trust {
    /// Trust from public keys in hex.
    pub fn new(public_keys: &[String], require: bool) -> Result<Trust, Error> {
        let keys = public_keys
            .iter()
            .map(|k| {
                let bytes = bytes32(k, &format!("trusted key {k:?}"))?;
                VerifyingKey::from_bytes(&bytes)
                    .map_err(|e| sig_error(format!("trusted key {k}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Trust { keys, require })
    }

    /// Checks a manifest's bytes against its signature file's text, if there is one.
    pub fn check(&self, manifest: &[u8], signature: Option<&str>) -> Result<Signed, Error> {
        let Some(text) = signature else {
            return if self.require {
                Err(sig_error("the manifest is not signed and require_signature is on; sign it with `supervisor weights sign`".into()))
            } else {
                Ok(Signed::Unsigned)
            };
        };
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [SIG_TAG, key_hex, sig_hex] = fields[..] else {
            return Err(sig_error(format!(
                "malformed signature file: expected `{SIG_TAG} <key> <signature>`"
            )));
        };
        let key = bytes32(key_hex, "the signing key")?;
        let Some(trusted) = self.keys.iter().find(|k| k.to_bytes() == key) else {
            return Err(sig_error(format!(
                "it is signed by {key_hex}, which is not among the box's trusted keys"
            )));
        };
        let sig_bytes: [u8; 64] = hex::decode(sig_hex)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| sig_error("the signature must be 128 hex digits".into()))?;
        trusted
            .verify_strict(manifest, &Signature::from_bytes(&sig_bytes))
            .map_err(|_| sig_error("the signature does not match the signed bytes: the manifest or file was changed after signing, or signed with another key".into()))?;
        Ok(Signed::By(key_hex.to_string()))
    }
}
