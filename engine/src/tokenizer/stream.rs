//! Streaming detokenization: token bytes in, whole UTF-8 characters out. A character split
//! across tokens (emoji, CJK through byte fallback) is held back until it completes, so a
//! stream never shows half a character; bytes that can never form one become U+FFFD.

/// Bytes of generated tokens, released as text one complete character at a time.
#[derive(Debug, Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Adds a token's bytes; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Ends the stream. An unfinished character left over (a token limit cut it) is dropped:
    /// the output stays whole characters, never a trailing U+FFFD. Returns how many bytes
    /// were dropped.
    pub fn finish(&mut self) -> usize {
        let dropped = self.pending.len();
        self.pending.clear();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_tokens_come_out_whole() {
        let text = "a😀é北";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            for split2 in split..=bytes.len() {
                let mut s = TextStream::new();
                let parts = [
                    s.push(&bytes[..split]),
                    s.push(&bytes[split..split2]),
                    s.push(&bytes[split2..]),
                ];
                assert_eq!(s.finish(), 0);
                assert_eq!(parts.concat(), text, "splits {split} {split2}");
                assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')));
            }
        }
    }

    #[test]
    fn held_back_until_complete() {
        let mut s = TextStream::new();
        let emoji = "🚀".as_bytes();
        assert_eq!(s.push(&emoji[..2]), "");
        assert_eq!(s.push(&emoji[2..3]), "");
        assert_eq!(s.push(&emoji[3..]), "🚀");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = TextStream::new();
        assert_eq!(s.push(b"x\xffy"), "x\u{FFFD}y");
        assert_eq!(s.push(b"\xe4\xb8"), "");
        assert_eq!(s.push(b"ok"), "\u{FFFD}ok");
    }

    #[test]
    fn a_character_cut_by_the_end_is_dropped() {
        let mut s = TextStream::new();
        let emoji = "😀".as_bytes();
        assert_eq!(s.push(b"hi "), "hi ");
        assert_eq!(s.push(&emoji[..3]), "");
        assert_eq!(s.finish(), 3);
        assert_eq!(s.push(b"ok"), "ok");
    }
}
