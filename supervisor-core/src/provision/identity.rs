//! The box's identity, made on the box and never leaving it: an ed25519 device key, and the
//! TLS key and certificate the dashboard serves HTTPS with (ECDSA P-256, which every browser
//! speaks; the device key vouches for it at enrolment).

use ed25519_dalek::{Signer, SigningKey};
use sha2::{Digest, Sha256};

use super::PROVISION_DIR;
use crate::board::Board;
use provision::BoxSettings;

/// The device key's secret half (hex seed), owner-only.
pub const DEVICE_KEY: &str = "/var/lib/appliance/provision/device.key";
/// The TLS private key (PKCS#8 DER), owner-only.
pub const TLS_KEY: &str = "/var/lib/appliance/provision/tls-key.der";
/// The TLS certificate (DER), self-signed.
pub const TLS_CERT: &str = "/var/lib/appliance/provision/tls-cert.der";

/// The device key, made the first time it is needed: with an exclusive create, so two callers
/// at once (provisioning and an enrolment answer) end with the same key, never one each.
pub fn device_key(board: &Board) -> Result<SigningKey, String> {
    if let Some(key) = read_device_key(board)? {
        return Ok(key);
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("the OS random source failed: {e}"))?;
    board
        .create_dir_all(PROVISION_DIR)
        .map_err(|e| e.to_string())?;
    board
        .create_private_file(DEVICE_KEY, format!("{}\n", hex::encode(seed)).as_bytes())
        .map_err(|e| e.to_string())?;
    read_device_key(board)?.ok_or_else(|| format!("{DEVICE_KEY} vanished as it was made"))
}

fn read_device_key(board: &Board) -> Result<Option<SigningKey>, String> {
    let Some(text) = board.read_optional(DEVICE_KEY).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let seed: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("{DEVICE_KEY} is damaged (not 64 hex digits)"))?;
    Ok(Some(SigningKey::from_bytes(&seed)))
}

/// The device key's public half in hex.
pub fn public_hex(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().as_bytes())
}

/// The TLS certificate and key the dashboard serves, if the box has them.
pub fn tls_identity(board: &Board) -> Option<(Vec<u8>, Vec<u8>)> {
    let cert = board.read_bytes(TLS_CERT).ok()?;
    let key = board.read_bytes(TLS_KEY).ok()?;
    Some((cert, key))
}

/// SHA-256 of the certificate the box serves, hex (what `fleet.lock` pins).
pub fn certificate_sha256(board: &Board) -> Option<String> {
    board
        .read_bytes(TLS_CERT)
        .ok()
        .map(|der| hex::encode(Sha256::digest(&der)))
}

/// Makes the TLS key (once) and a certificate naming the box (`renew`: a new generation may
/// have changed its names; also when there is none). Returns the certificate's SHA-256.
pub fn ensure_tls(board: &Board, settings: &BoxSettings, renew: bool) -> Result<String, String> {
    if !renew
        && let Some(sha) = certificate_sha256(board)
        && board.exists(TLS_KEY)
    {
        return Ok(sha);
    }
    let key = match board.read_bytes(TLS_KEY) {
        Ok(der) => rcgen::KeyPair::try_from(der.as_slice())
            .map_err(|e| format!("{TLS_KEY} is damaged ({e}); remove it to make a new one"))?,
        Err(_) => {
            let key = rcgen::KeyPair::generate().map_err(|e| format!("making the TLS key: {e}"))?;
            board
                .replace_private_file(TLS_KEY, &key.serialize_der())
                .map_err(|e| e.to_string())?;
            key
        }
    };
    let host = settings
        .effective_hostname()
        .map_or("appliance", |h| h.as_str())
        .to_string();
    let mut params = rcgen::CertificateParams::new(vec![host.clone(), format!("{host}.local")])
        .map_err(|e| format!("the certificate's names: {e}"))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host.as_str());
    if let Some(address) = settings.network.as_ref().and_then(|n| n.address) {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(address.address));
    }
    // A box may boot with its clock far off (no RTC battery): valid from long before any
    // build to long after any service life.
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2070, 1, 1);
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("making the TLS certificate: {e}"))?;
    board
        .replace_file(TLS_CERT, cert.der())
        .map_err(|e| e.to_string())?;
    Ok(hex::encode(Sha256::digest(cert.der())))
}

/// The box's answer to an enrolment request with `nonce` (see `provision::enroll`).
pub fn enroll_answer(
    board: &Board,
    settings: &BoxSettings,
    record: &super::Record,
    nonce: &str,
) -> Result<provision::enroll::Answer, String> {
    let token = settings.enrollment_token.as_ref().ok_or(
        "this box was provisioned without an enrolment token (stamp it with `appliance stamp`)",
    )?;
    let key = device_key(board)?;
    let public = public_hex(&key);
    let cert = certificate_sha256(board).ok_or("the box has no TLS certificate yet")?;
    let signed = provision::enroll::message(nonce, &public, &cert);
    Ok(provision::enroll::Answer {
        name: record.name.clone().unwrap_or_default(),
        fleet: record.fleet.clone().unwrap_or_default(),
        generation: record.generation,
        serial: record.serial.clone(),
        device_public_key: public,
        certificate_sha256: cert,
        proof: provision::enroll::proof(token.as_str(), &signed),
        signature: hex::encode(key.sign(signed.as_bytes()).to_bytes()),
    })
}

/// Who the box is, for a client that asks with `nonce`: the device key signs the nonce with the
/// certificate the box serves. Nothing secret; `None` before the box has a device key and
/// certificate (it is not provisioned).
pub fn identity_answer(
    board: &Board,
    nonce: &str,
) -> Result<Option<provision::enroll::Identity>, String> {
    if !board.exists(DEVICE_KEY) {
        return Ok(None);
    }
    let Some(cert) = certificate_sha256(board) else {
        return Ok(None);
    };
    let key = device_key(board)?;
    let public = public_hex(&key);
    let signed = provision::enroll::identity_message(nonce, &public, &cert);
    Ok(Some(provision::enroll::Identity {
        device_public_key: public,
        certificate_sha256: cert,
        signature: hex::encode(key.sign(signed.as_bytes()).to_bytes()),
    }))
}
