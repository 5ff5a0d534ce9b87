/// Output kept per attempt: the last 64 KiB of stdout and stderr, interleaved.
pub use gnomon_proto::limits::MAX_OUTPUT_BYTES;

/// A bounded tail of bytes.
#[derive(Debug, Default, Clone)]
pub struct OutputTail {
    buf: std::collections::VecDeque<u8>,
    dropped: u64,
}

impl OutputTail {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let excess = self.buf.len().saturating_sub(MAX_OUTPUT_BYTES);
        if excess > 0 {
            self.buf.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    /// The tail as text (lossy UTF-8), prefixed with a note when truncated.
    pub fn into_string(self) -> String {
        let bytes: Vec<u8> = self.buf.into_iter().collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if self.dropped > 0 {
            format!("[gnomon: {} earlier bytes dropped]\n{text}", self.dropped)
        } else {
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_64k() {
        let mut t = OutputTail::default();
        t.push(&vec![b'a'; MAX_OUTPUT_BYTES]);
        t.push(b"end");
        let s = t.into_string();
        assert!(s.starts_with("[gnomon: 3 earlier bytes dropped]"));
        assert!(s.ends_with("aend"));
    }
}
