//! A bounded, incremental `text/event-stream` decoder (WHATWG HTML "server-sent events").
//!
//! Bytes are fed as they arrive; a line never grows past `max_line` bytes and an event's data
//! never past `max_event` bytes: the decoder fails instead (the caller drops the connection with
//! `child-frame-too-large`). Nothing is buffered beyond those two bounds, whatever the peer
//! sends. Lines end with CRLF, LF or CR; a leading UTF-8 BOM is skipped; `:` lines are comments;
//! a blank line dispatches the event (an event without data is not dispatched).

/// Largest accepted line of an event stream (bytes): every child transport's frame bound.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Largest accepted event (bytes of data); also a streamable-HTTP child's JSON response bound.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// `event:` field (`None` = the default type, "message").
    pub event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id in force when the event was dispatched.
    pub id: Option<String>,
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A line exceeded the line bound.
    #[error("an SSE line exceeded {0} bytes")]
    LineTooLong(usize),
    /// An event's data exceeded the event bound.
    #[error("an SSE event exceeded {0} bytes")]
    EventTooLarge(usize),
}

/// The decoder state.
#[derive(Debug)]
pub struct Decoder {
    max_line: usize,
    max_event: usize,
    line: Vec<u8>,
    after_cr: bool,
    bom_checked: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    last_id: Option<String>,
    retry: Option<u64>,
}

impl Decoder {
    /// A decoder with the given bounds (bytes).
    pub fn new(max_line: usize, max_event: usize) -> Self {
        Decoder {
            max_line,
            max_event,
            line: Vec::new(),
            after_cr: false,
            bom_checked: false,
            data: String::new(),
            has_data: false,
            event: None,
            last_id: None,
            retry: None,
        }
    }

    /// Feeds bytes; complete events are appended to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Event>) -> Result<(), DecodeError> {
        if !self.bom_checked {
            // The BOM may arrive split; wait for three bytes (or a mismatch) before deciding.
            let have = self.line.len();
            let want = 3usize.saturating_sub(have).min(chunk.len());
            let mut head = self.line.clone();
            head.extend_from_slice(&chunk[..want]);
            let bom = b"\xEF\xBB\xBF";
            if head.len() < 3 && bom.starts_with(&head) {
                self.line = head;
                return Ok(());
            }
            self.bom_checked = true;
            if head.as_slice() == bom {
                self.line.clear();
                chunk = &chunk[want..];
            } else {
                let pending = std::mem::take(&mut self.line);
                self.feed(&pending, out)?;
            }
        }
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[0] == b'\n' {
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
                Some(i) => {
                    self.push_line_bytes(&chunk[..i])?;
                    self.after_cr = chunk[i] == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&line, out)?;
                    self.line = line;
                    self.line.clear();
                    chunk = &chunk[i + 1..];
                }
                None => {
                    self.push_line_bytes(chunk)?;
                    chunk = &[];
                }
            }
        }
        Ok(())
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        if self.line.len() + bytes.len() > self.max_line {
            return Err(DecodeError::LineTooLong(self.max_line));
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) -> Result<(), DecodeError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match name {
            b"data" => {
                let extra = value.len() + usize::from(self.has_data);
                if self.data.len() + extra > self.max_event {
                    return Err(DecodeError::EventTooLarge(self.max_event));
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value.into_owned()),
            b"id" if !value.contains('\0') => self.last_id = Some(value.into_owned()),
            b"retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) {
        let event = self.event.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(Event {
            event: event.filter(|e| !e.is_empty()),
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        });
    }

    /// The reconnection time a `retry:` field set since the last call (milliseconds).
    pub fn take_retry(&mut self) -> Option<u64> {
        self.retry.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Result<Vec<Event>, DecodeError> {
        let mut d = Decoder::new(64, 128);
        let mut out = vec![];
        for c in chunks {
            d.feed(c, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn events_split_anywhere_decode_the_same() {
        let text = b"\xEF\xBB\xBFevent: endpoint\r\ndata: /messages?s=1\r\n\r\n: comment\nid: 7\ndata: {\"a\":1}\ndata:x\n\nretry: 250\n\n";
        let whole = decode(&[text]).unwrap();
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[0].event.as_deref(), Some("endpoint"));
        assert_eq!(whole[0].data, "/messages?s=1");
        assert_eq!(whole[1].data, "{\"a\":1}\nx");
        assert_eq!(whole[1].id.as_deref(), Some("7"));
        let mut d = Decoder::new(64, 128);
        d.feed(text, &mut vec![]).unwrap();
        assert_eq!(d.take_retry(), Some(250));
        for split in 1..text.len() {
            let (a, b) = text.split_at(split);
            assert_eq!(decode(&[a, b]).unwrap(), whole, "split at {split}");
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(decode(&bytes).unwrap(), whole);
    }

    #[test]
    fn lines_and_events_are_bounded_while_streaming() {
        let long = vec![b'a'; 65];
        assert_eq!(
            decode(&[b"data: ", &long]),
            Err(DecodeError::LineTooLong(64))
        );
        // An unterminated line fails as soon as it passes the bound, not at its end.
        let mut d = Decoder::new(64, 128);
        let mut out = vec![];
        assert!(d.feed(&[b'x'; 60], &mut out).is_ok());
        assert!(d.feed(&[b'x'; 10], &mut out).is_err());
        let line = format!("data: {}\n", "b".repeat(50));
        let many: Vec<u8> = line.repeat(3).into_bytes();
        assert_eq!(decode(&[&many]), Err(DecodeError::EventTooLarge(128)));
    }

    #[test]
    fn cr_only_line_endings_and_fields_without_colon() {
        let out = decode(&[b"data\rdata: x\r\r"]).unwrap();
        assert_eq!(out[0].data, "\nx");
    }
}
