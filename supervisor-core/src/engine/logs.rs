//! The engine's recent output lines, bounded, for the dashboard and for the status after a crash.

use std::collections::VecDeque;
use std::sync::Mutex;

/// A bounded ring of log lines: the oldest go first.
#[derive(Debug)]
pub struct LogRing {
    lines: Mutex<VecDeque<String>>,
    capacity: usize,
}

/// Longest line kept, in bytes; a runaway line is cut, not allowed to fill memory.
const MAX_LINE: usize = 2048;

impl LogRing {
    /// A ring keeping the last `capacity` lines.
    pub fn new(capacity: usize) -> LogRing {
        LogRing {
            lines: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity: capacity.max(1),
        }
    }

    /// Adds a line, dropping the oldest when full.
    pub fn push(&self, line: &str) {
        let mut end = line.len().min(MAX_LINE);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == self.capacity {
            lines.pop_front();
        }
        lines.push_back(line[..end].to_string());
    }

    /// The last `n` lines, oldest first.
    pub fn recent(&self, n: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .iter()
            .skip(lines.len().saturating_sub(n))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::LogRing;

    #[test]
    fn keeps_the_last_lines_and_cuts_long_ones_on_a_character_boundary() {
        let ring = LogRing::new(3);
        for i in 0..5 {
            ring.push(&format!("line {i}"));
        }
        assert_eq!(ring.recent(10), ["line 2", "line 3", "line 4"]);
        assert_eq!(ring.recent(1), ["line 4"]);
        ring.push(&"é".repeat(2000));
        assert!(ring.recent(1)[0].len() <= 2048);
    }
}
