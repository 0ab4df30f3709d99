//! One byte-level server-sent-events decoder and encoder for every provider.
//!
//! The decoder works on bytes and only decodes UTF-8 once a line is complete,
//! so a chunk boundary inside a multi-byte character is harmless. Lines end in
//! `\r\n`, `\n` or `\r`; a `\r` at the end of a chunk is remembered so that a
//! `\n` opening the next chunk does not make a spurious blank line. The line
//! being assembled is capped, so an upstream that never ends a line cannot
//! grow memory without bound.

use crate::scan;

/// One dispatched event: its joined `data:` lines. The `event:` name is not
/// kept: no translator needs it (Anthropic repeats it as the data's `type`),
/// and keeping it cost an allocation per event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub data: String,
    /// The data came in more than one line, so it holds a line break: a
    /// copy of it would break the client's framing.
    pub multiline: bool,
}

/// The stream broke the framing rules we can live with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// A line or an event grew past the cap.
    TooLong { limit: usize },
}

/// Incremental SSE decoder: feed chunks with [`SseDecoder::push`], then call
/// [`SseDecoder::finish`] at end of stream.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    /// The event being read has more than one data line.
    multiline: bool,
    /// The previous chunk ended in `\r`: a leading `\n` belongs to it.
    after_cr: bool,
    limit: usize,
}

/// Default cap on one line and on one event's data.
pub const DEFAULT_LIMIT: usize = 8 * 1024 * 1024;

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::with_limit(DEFAULT_LIMIT)
    }
}

impl SseDecoder {
    pub fn with_limit(limit: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            multiline: false,
            after_cr: false,
            limit,
        }
    }

    /// Decodes `chunk`, appending every completed event to `out`.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if self.after_cr && !chunk.is_empty() {
            if let [b'\n', rest @ ..] = chunk {
                chunk = rest;
            }
            self.after_cr = false;
        }
        while !chunk.is_empty() {
            match scan::position_of_either(chunk, b'\n', b'\r') {
                None => {
                    self.line.extend_from_slice(chunk);
                    self.check_len()?;
                    return Ok(());
                }
                Some(at) => {
                    let (head, tail) = chunk.split_at(at);
                    if self.line.is_empty() {
                        // The whole line is in this chunk: read it in place.
                        if head.len() > self.limit {
                            return Err(SseError::TooLong { limit: self.limit });
                        }
                        self.line_done(head, out)?;
                    } else {
                        self.line.extend_from_slice(head);
                        self.check_len()?;
                        self.end_line(out)?;
                    }
                    let (terminator, rest) = tail.split_first().map_or((b'\n', &[][..]), |(t, r)| (*t, r));
                    chunk = rest;
                    if terminator == b'\r' {
                        match chunk {
                            [b'\n', rest @ ..] => chunk = rest,
                            [] => self.after_cr = true,
                            _ => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// End of stream. A last event without its blank line is still
    /// dispatched: providers that end on `data: [DONE]\n` are common enough.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        self.dispatch(out);
        self.after_cr = false;
        Ok(())
    }

    /// Bytes held while waiting for the rest of a line.
    pub fn pending(&self) -> usize {
        self.line.len() + self.data.len()
    }

    fn check_len(&self) -> Result<(), SseError> {
        if self.line.len() > self.limit {
            return Err(SseError::TooLong { limit: self.limit });
        }
        Ok(())
    }

    /// The line held across chunks is complete.
    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = std::mem::take(&mut self.line);
        let done = self.line_done(&line, out);
        self.line = reuse(line);
        done
    }

    /// One complete line, without its terminator.
    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line.first() == Some(&b':') {
            return Ok(());
        }
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(at) => {
                let (name, rest) = line.split_at(at);
                let value = rest.get(1..).unwrap_or(&[]);
                (name, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        // Only data matters to a translator: event, id, retry and unknown
        // fields are skipped.
        if name != b"data" {
            return Ok(());
        }
        if self.has_data {
            self.data.push('\n');
            self.multiline = true;
        }
        // from_utf8 checks ASCII a word at a time; lossy decoding only when
        // it must replace something.
        match std::str::from_utf8(value) {
            Ok(text) => self.data.push_str(text),
            Err(_) => self.data.push_str(&String::from_utf8_lossy(value)),
        }
        self.has_data = true;
        if self.data.len() > self.limit {
            return Err(SseError::TooLong { limit: self.limit });
        }
        Ok(())
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if self.has_data {
            // Sized like this event: the next is likely similar, and one
            // allocation beats growing from nothing every event.
            let next = String::with_capacity(self.data.len().min(64 * 1024));
            out.push(SseEvent {
                data: std::mem::replace(&mut self.data, next),
                multiline: self.multiline,
            });
        }
        self.has_data = false;
        self.multiline = false;
    }
}

/// Keeps the line's allocation for the next line.
fn reuse(mut line: Vec<u8>) -> Vec<u8> {
    line.clear();
    line
}

/// Appends one `data: <payload>\n\n` event.
pub fn write_data(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
}

/// The terminal event of an OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every chunking of `input` that the replay rule asks for: whole, byte by
    /// byte, and every two-piece split.
    pub fn chunkings(input: &[u8]) -> Vec<Vec<&[u8]>> {
        let mut all = vec![vec![input], input.chunks(1).collect()];
        for at in 1..input.len() {
            let (a, b) = input.split_at(at);
            all.push(vec![a, b]);
        }
        all
    }

    fn decode_all(input: &[u8]) -> Vec<SseEvent> {
        let mut reference: Option<Vec<SseEvent>> = None;
        for chunks in chunkings(input) {
            let mut d = SseDecoder::default();
            let mut out = Vec::new();
            for c in &chunks {
                d.push(c, &mut out).unwrap();
            }
            d.finish(&mut out).unwrap();
            match &reference {
                None => reference = Some(out),
                Some(r) => assert_eq!(
                    &out,
                    r,
                    "chunking {:?} differs",
                    chunks.iter().map(|c| c.len()).collect::<Vec<_>>()
                ),
            }
        }
        reference.unwrap()
    }

    fn ev(data: &str) -> SseEvent {
        SseEvent {
            data: data.to_string(),
            multiline: data.contains('\n'),
        }
    }

    #[test]
    fn lf_crlf_and_cr_line_endings_frame_the_same() {
        let expect = vec![ev("a"), ev("b\nc")];
        assert_eq!(decode_all(b"data: a\n\nevent: x\ndata: b\ndata: c\n\n"), expect);
        assert_eq!(
            decode_all(b"data: a\r\n\r\nevent: x\r\ndata: b\r\ndata: c\r\n\r\n"),
            expect
        );
        assert_eq!(decode_all(b"data: a\r\revent: x\rdata: b\rdata: c\r\r"), expect);
    }

    #[test]
    fn cr_lf_split_across_chunks_is_one_line_end() {
        // The regression Higress' framer has: "\r" | "\n" must not be a blank line.
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        d.push(b"data: a\r", &mut out).unwrap();
        d.push(b"\ndata: b\r\n\r\n", &mut out).unwrap();
        assert_eq!(out, vec![ev("a\nb")]);
    }

    #[test]
    fn split_utf8_characters_survive() {
        let input = "data: {\"t\":\"héllo ✓ 🎉\"}\n\n".as_bytes();
        assert_eq!(decode_all(input), vec![ev("{\"t\":\"héllo ✓ 🎉\"}")]);
    }

    #[test]
    fn comments_ids_and_retry_are_ignored() {
        assert_eq!(decode_all(b": ping\n\nid: 1\nretry: 5\ndata:x\n\n"), vec![ev("x")]);
    }

    #[test]
    fn an_unterminated_last_event_is_flushed() {
        assert_eq!(decode_all(b"data: [DONE]"), vec![ev("[DONE]")]);
        assert_eq!(decode_all(b"data: [DONE]\n"), vec![ev("[DONE]")]);
    }

    #[test]
    fn incomplete_buffer_growth_is_bounded() {
        let mut d = SseDecoder::with_limit(16);
        let mut out = Vec::new();
        d.push(b"data: 0123456789", &mut out).unwrap();
        assert_eq!(d.push(b"abcdef", &mut out), Err(SseError::TooLong { limit: 16 }));
    }

    #[test]
    fn writer_frames_data() {
        let mut out = Vec::new();
        write_data(&mut out, b"{}");
        assert_eq!(out, b"data: {}\n\n");
    }
}
