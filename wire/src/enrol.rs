//! Enrolment and identity: what `appliance fleet enroll` and `appliance fleet status` send a
//! box (a fresh nonce) and what the box answers. The checks of the answers (the proof, the
//! signatures) are `provision::enroll`'s; these are only the documents.

use serde::{Deserialize, Serialize};

/// The body of `POST /api/enroll` and `POST /api/identity`: `{"nonce": "<hex>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonceRequest {
    /// 32-128 hex digits, fresh for each request. Required.
    pub nonce: String,
}

/// What the box answers to an enrolment request. Every field is required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The box's name in the fleet.
    pub name: String,
    /// The fleet.
    pub fleet: String,
    /// The applied provisioning generation.
    pub generation: u64,
    /// The board serial, when known (`null` otherwise; may be absent).
    pub serial: Option<String>,
    /// The device key's public half, 64 hex digits.
    pub device_public_key: String,
    /// SHA-256 of the TLS certificate's DER, 64 hex digits.
    pub certificate_sha256: String,
    /// HMAC-SHA256 of the enrolment message under the enrolment token, hex.
    pub proof: String,
    /// ed25519 signature of the enrolment message by the device key, hex.
    pub signature: String,
}

/// What the box answers when asked who it is (no token needed, nothing secret in it): its
/// device key signs the nonce with the certificate it serves. Every field is required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The device key's public half, 64 hex digits.
    pub device_public_key: String,
    /// SHA-256 of the TLS certificate's DER, 64 hex digits.
    pub certificate_sha256: String,
    /// ed25519 signature of the identity message by the device key, hex.
    pub signature: String,
}
