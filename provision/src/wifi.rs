//! The WPA PSK of a Wi-Fi network, so that a fleet file never holds its passphrase.

use crate::values::{Ssid, WifiPsk};

/// The WPA2 pre-shared key for `ssid` and `passphrase` (IEEE 802.11i: PBKDF2-HMAC-SHA1, the
/// SSID as salt, 4096 rounds, 32 bytes), as the 64 hex digits `wpa_passphrase` prints.
pub fn psk(ssid: &Ssid, passphrase: &str) -> Result<WifiPsk, String> {
    if !(8..=63).contains(&passphrase.len()) || !passphrase.bytes().all(|b| (32..127).contains(&b))
    {
        return Err(
            "a WPA passphrase is 8-63 printable ASCII characters; check the one you typed".into(),
        );
    }
    let mut key = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<sha1::Sha1>(
        passphrase.as_bytes(),
        ssid.as_str().as_bytes(),
        4096,
        &mut key,
    );
    WifiPsk::try_from(hex::encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_psk_is_the_standard_one() {
        // IEEE 802.11i-2004, annex H.4 test vector 1.
        let ssid: Ssid = "IEEE".parse().expect("ssid");
        assert_eq!(
            psk(&ssid, "password").map(String::from),
            Ok("f42c6fc52df0ebef9ebb4b90b38a5f902e83fe1b135a70e23aed762e9710a12e".into())
        );
        assert!(psk(&ssid, "short").is_err());
    }
}
