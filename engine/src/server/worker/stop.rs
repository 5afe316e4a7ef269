//! Stop strings: text that might begin one is held back, and the text is cut at the first.

/// Holds back text that might be the start of a stop string, and cuts at the first stop string.
pub(super) struct StopFilter<'a> {
    stops: &'a [String],
    pending: String,
}

impl<'a> StopFilter<'a> {
    pub(super) fn new(stops: &'a [String]) -> StopFilter<'a> {
        StopFilter {
            stops,
            pending: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to send and the stop string reached, if any.
    pub(super) fn push(&mut self, piece: &str) -> (String, Option<String>) {
        self.pending.push_str(piece);
        let first_stop = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, word)) = first_stop {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, Some(word.clone()));
        }
        // Keep the longest tail that is a prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .find(|&n| self.pending.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, None)
    }

    /// Whatever is held back, at the end.
    pub(super) fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_the_text_even_across_pieces() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("Hello E"), ("Hello ".to_string(), None));
        assert_eq!(f.push("N"), (String::new(), None));
        assert_eq!(f.push("Dx"), (String::new(), Some("END".to_string())));
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("a\n"), ("a".to_string(), None));
        assert_eq!(f.push("b"), ("\nb".to_string(), None));
        assert_eq!(
            f.push("\n\nrest"),
            (String::new(), Some("\n\n".to_string()))
        );
        let mut f = StopFilter::new(&[]);
        assert_eq!(f.push("free"), ("free".to_string(), None));
        assert_eq!(f.flush(), "");
    }

    #[test]
    fn held_back_text_is_released_at_the_end() {
        let stops = vec!["STOP".to_string()];
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("ab ST"), ("ab ".to_string(), None));
        assert_eq!(f.flush(), "ST");
    }
}
