//! Enrolment: how `appliance fleet enroll` learns a box's identity and knows it is the box it
//! stamped.
//!
//! `appliance stamp` gives each box a one-time token derived from the fleet's secret (kept
//! beside the fleet file, never on a box but this one's token). Enrolling, the tool sends a fresh
//! nonce; the box answers with its device public key, the SHA-256 of its TLS certificate, an
//! HMAC of all three under the token (it holds the token) and an ed25519 signature of the same
//! by its device key (it holds the key). The tool checks both and records key and certificate
//! in `fleet.lock`; the token is never sent.

use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

pub use wire::enrol::{Answer, Identity};

/// The bytes both the proof and the signature cover.
pub fn message(nonce: &str, device_public_key: &str, certificate_sha256: &str) -> String {
    format!("appliance-enroll-v1\n{nonce}\n{device_public_key}\n{certificate_sha256}\n")
}

/// The token of box `name` in generation `generation` of `fleet`, from the fleet's secret.
pub fn derive_token(fleet_secret: &[u8], fleet: &str, name: &str, generation: u64) -> String {
    mac_hex(
        fleet_secret,
        format!("appliance-enrollment-token-v1\n{fleet}\n{name}\n{generation}\n").as_bytes(),
    )
}

/// HMAC-SHA256 of `message` under the token's text.
pub fn proof(token: &str, message: &str) -> String {
    mac_hex(token.as_bytes(), message.as_bytes())
}

fn mac_hex(key: &[u8], data: &[u8]) -> String {
    // HMAC takes keys of any length.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

/// Checks an answer to `nonce` against the token the tool derived for the box; the error says
/// what did not match.
pub fn check(answer: &Answer, nonce: &str, token: &str) -> Result<(), String> {
    let signed = message(nonce, &answer.device_public_key, &answer.certificate_sha256);
    let presented = hex::decode(&answer.proof).unwrap_or_default();
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(token.as_bytes())
        .unwrap_or_else(|_| unreachable!());
    mac.update(signed.as_bytes());
    if mac.verify_slice(&presented).is_err() {
        return Err(
            "the box does not hold this box's enrolment token: not the box that was stamped, or stamped with another fleet secret or generation".into(),
        );
    }
    verify(&answer.device_public_key, &answer.signature, &signed)
}

/// The bytes an identity signature covers.
pub fn identity_message(nonce: &str, device_public_key: &str, certificate_sha256: &str) -> String {
    format!("appliance-identity-v1\n{nonce}\n{device_public_key}\n{certificate_sha256}\n")
}

/// Checks that `identity`, asked with `nonce` over a connection that presented certificate
/// `presented`, comes from the device key `enrolled`.
pub fn check_identity(
    identity: &Identity,
    nonce: &str,
    enrolled: &str,
    presented: &str,
) -> Result<(), String> {
    if !identity.device_public_key.eq_ignore_ascii_case(enrolled) {
        return Err(format!(
            "it has device key {}, enrolled was {enrolled}: the box was replaced or its data partition wiped, or another machine answers",
            identity.device_public_key
        ));
    }
    if !identity.certificate_sha256.eq_ignore_ascii_case(presented) {
        return Err(format!(
            "its device key vouches for certificate {} but the connection presented {presented}: something is in between",
            identity.certificate_sha256
        ));
    }
    let signed = identity_message(
        nonce,
        &identity.device_public_key,
        &identity.certificate_sha256,
    );
    verify(&identity.device_public_key, &identity.signature, &signed)
}

fn verify(public_key: &str, signature: &str, message: &str) -> Result<(), String> {
    let key: [u8; 32] = hex::decode(public_key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or("the device public key is not 64 hex digits")?;
    let key = VerifyingKey::from_bytes(&key).map_err(|e| format!("the device public key: {e}"))?;
    let signature: [u8; 64] = hex::decode(signature)
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or("the signature is not 128 hex digits")?;
    key.verify_strict(message.as_bytes(), &Signature::from_bytes(&signature))
        .map_err(|_| "the device key's signature does not verify".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    fn answer(token: &str, nonce: &str, key: &SigningKey) -> Answer {
        let public = hex::encode(key.verifying_key().as_bytes());
        let cert = "c".repeat(64);
        let signed = message(nonce, &public, &cert);
        Answer {
            name: "north-1".into(),
            fleet: "clinics".into(),
            generation: 1,
            serial: None,
            device_public_key: public,
            certificate_sha256: cert,
            proof: proof(token, &signed),
            signature: hex::encode(key.sign(signed.as_bytes()).to_bytes()),
        }
    }

    #[test]
    fn only_the_box_with_the_token_and_the_key_passes() {
        let token = derive_token(b"fleet secret", "clinics", "north-1", 1);
        assert_ne!(
            token,
            derive_token(b"fleet secret", "clinics", "north-1", 2)
        );
        assert_ne!(
            token,
            derive_token(b"other secret", "clinics", "north-1", 1)
        );
        let key = SigningKey::from_bytes(&[7; 32]);
        let good = answer(&token, "n1", &key);
        check(&good, "n1", &token).expect("genuine");
        assert!(check(&good, "n2", &token).is_err(), "a replayed answer");
        let other = derive_token(b"fleet secret", "clinics", "north-2", 1);
        assert!(check(&answer(&other, "n1", &key), "n1", &token).is_err());
        let mut swapped = good.clone();
        swapped.certificate_sha256 = "d".repeat(64);
        assert!(
            check(&swapped, "n1", &token).is_err(),
            "another certificate"
        );
        let mut forged = good;
        forged.signature = "00".repeat(64);
        assert!(check(&forged, "n1", &token).is_err(), "a bad signature");
    }

    #[test]
    fn an_identity_binds_the_connection_to_the_enrolled_device_key() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let public = hex::encode(key.verifying_key().as_bytes());
        let cert = "e".repeat(64);
        let identity = Identity {
            device_public_key: public.clone(),
            certificate_sha256: cert.clone(),
            signature: hex::encode(
                key.sign(identity_message("n", &public, &cert).as_bytes())
                    .to_bytes(),
            ),
        };
        check_identity(&identity, "n", &public, &cert).expect("genuine");
        assert!(
            check_identity(&identity, "m", &public, &cert).is_err(),
            "replayed"
        );
        let other = hex::encode(SigningKey::from_bytes(&[1; 32]).verifying_key().as_bytes());
        let err = check_identity(&identity, "n", &other, &cert).expect_err("another key");
        assert!(err.contains("enrolled was"), "{err}");
        let err = check_identity(&identity, "n", &public, &"f".repeat(64)).expect_err("relayed");
        assert!(err.contains("in between"), "{err}");
    }
}
