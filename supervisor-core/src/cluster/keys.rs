//! The box's WireGuard key: made on the box the first time it is needed, kept owner-only on the
//! data partition in the form `wg set … private-key FILE` reads (so the private half never
//! appears on a command line), and its public half worked out here for status and enrolment.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use curve25519_dalek::montgomery::MontgomeryPoint;

use crate::board::Board;

/// The private key: 32 bytes in base64, one line, owner-only.
pub const PRIVATE_KEY: &str = "/var/lib/appliance/cluster/wireguard.key";
/// Its folder.
pub const DIR: &str = "/var/lib/appliance/cluster";

use crate::config::cluster::WireguardKey;

/// The public key of a private one, in base64 (X25519 with the scalar clamped, as `wg pubkey`).
pub fn public_of(private: &[u8; 32]) -> String {
    STANDARD.encode(MontgomeryPoint::mul_base_clamped(*private).to_bytes())
}

/// The box's public key, its private key made first if there is none (with an exclusive
/// create: two callers at once end with the same key).
pub fn public_key(board: &Board) -> Result<String, String> {
    if let Some(private) = read(board)? {
        return Ok(public_of(&private));
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("the OS random source failed: {e}"))?;
    board.create_private_dir(DIR).map_err(|e| e.to_string())?;
    board
        .create_private_file(
            PRIVATE_KEY,
            format!("{}\n", STANDARD.encode(seed)).as_bytes(),
        )
        .map_err(|e| e.to_string())?;
    let private = read(board)?.ok_or_else(|| format!("{PRIVATE_KEY} vanished as it was made"))?;
    Ok(public_of(&private))
}

/// The box's public key if its key was made already (never makes one: for reports).
pub fn public_key_if_made(board: &Board) -> Option<String> {
    read(board)
        .ok()
        .flatten()
        .map(|private| public_of(&private))
}

fn read(board: &Board) -> Result<Option<[u8; 32]>, String> {
    let Some(text) = board
        .read_optional(PRIVATE_KEY)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    WireguardKey::decode(&text).map(Some).ok_or_else(|| {
        format!("{PRIVATE_KEY} is damaged (not a base64 WireGuard key); remove it to make a new one, then give the new public key to the other members")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_key_is_wireguards() {
        // RFC 7748 §6.1: Alice's private and public keys.
        let private: [u8; 32] =
            hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .expect("hex")
                .try_into()
                .expect("32");
        let public = WireguardKey::decode(&public_of(&private)).expect("base64");
        assert_eq!(
            hex::encode(public),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
        assert_eq!(WireguardKey::decode("short"), None);
    }

    #[test]
    fn a_box_makes_its_key_once_and_keeps_it_private() {
        let dir = tempfile::tempdir().expect("dir");
        board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(dir.path()).expect("board");
        let first = public_key(&board).expect("made");
        assert_eq!(public_key(&board).expect("read"), first);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(board.path(PRIVATE_KEY))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "owner only");
        std::fs::write(board.path(PRIVATE_KEY), "damaged\n").expect("write");
        let e = public_key(&board).expect_err("damaged");
        assert!(e.contains("damaged"), "{e}");
    }
}
