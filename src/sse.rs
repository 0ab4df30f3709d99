//! One byte-level server-sent-events decoder and encoder for every provider.
//!
//! The decoder works on bytes and only decodes UTF-8 once a line is complete,
//! so a chunk boundary inside a multi-byte character is harmless. Lines end in
//! `\r\n`, `\n` or `\r`; a `\r` at the end of a chunk is remembered so that a
//! `\n` opening the next chunk does not make a spurious blank line. The line
//! being assembled is capped, so an upstream that never ends a line cannot
//! grow memory without bound.
//!
//! Events are handed out one at a time ([`SseDecoder::next`]), borrowed: an
//! event whose one data line and blank line are both in the chunk (most of
//! them: providers flush an event at a time) is read in place, with no copy
//! and no allocation; the others are assembled in a buffer the decoder
//! keeps for the next.

/// One dispatched event: its joined `data:` lines. The `event:` name is not
/// kept: no translator needs it (Anthropic repeats it as the data's `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    pub data: &'a str,
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

/// Incremental SSE decoder: take the events of each chunk with
/// [`SseDecoder::next`] until it has none, then the last with
/// [`SseDecoder::finish`] at end of stream.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    /// The data of the event being read, when it is not read in place.
    data: String,
    has_data: bool,
    /// The event being read has more than one data line.
    multiline: bool,
    /// The last event handed out was `data`: empty it before the next.
    data_handed_out: bool,
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

/// Where the first line of `bytes` ends: its `\n` or `\r`.
fn line_end(bytes: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', bytes)
}

/// What one complete line says.
enum Line<'l> {
    /// A blank line: the event ends.
    Blank,
    /// A `data:` field's value.
    Data(&'l [u8]),
    /// A comment, or a field no translator reads (`event`, `id`, `retry`).
    Skipped,
}

fn read_line(line: &[u8]) -> Line<'_> {
    // The lines of nearly every event, told by their first bytes (a slice
    // comparison would be a call to wasm's byte-at-a-time `memcmp`).
    match line {
        [] => return Line::Blank,
        [b'd', b'a', b't', b'a', b':', value @ ..] => return Line::Data(value.strip_prefix(b" ").unwrap_or(value)),
        [b'e', b'v', b'e', b'n', b't', b':', ..] => return Line::Skipped,
        _ => {}
    }
    let (name, value) = match memchr::memchr(b':', line) {
        Some(at) => {
            let (name, rest) = line.split_at(at);
            let value = rest.get(1..).unwrap_or(&[]);
            (name, value.strip_prefix(b" ").unwrap_or(value))
        }
        None => (line, &[][..]),
    };
    // A comment has an empty name; only data matters to a translator.
    if name == b"data" {
        Line::Data(value)
    } else {
        Line::Skipped
    }
}

impl SseDecoder {
    pub fn with_limit(limit: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            multiline: false,
            data_handed_out: false,
            after_cr: false,
            limit,
        }
    }

    /// The next event completed by `chunk`, which is advanced past it;
    /// `None` once the chunk is used up (its unfinished tail is kept).
    pub fn next<'s, 'c: 's>(&'s mut self, chunk: &mut &'c [u8]) -> Result<Option<SseEvent<'s>>, SseError> {
        if std::mem::take(&mut self.data_handed_out) {
            self.data.clear();
        }
        if self.after_cr && !chunk.is_empty() {
            if let [b'\n', rest @ ..] = *chunk {
                *chunk = rest;
            }
            self.after_cr = false;
        }
        // The data of an event whose data line is whole in this chunk, not
        // yet copied: if its blank line is here too, it is handed out as is.
        let mut in_place: Option<&'c str> = None;
        loop {
            let Some(at) = line_end(chunk) else {
                if let Some(text) = in_place {
                    self.data.push_str(text);
                }
                self.line.extend_from_slice(chunk);
                *chunk = &[];
                self.check_len()?;
                return Ok(None);
            };
            let whole: &'c [u8] = chunk;
            let (head, tail) = whole.split_at(at);
            let (terminator, mut rest) = tail.split_first().map_or((b'\n', &[][..]), |(t, r)| (*t, r));
            if terminator == b'\r' {
                match rest {
                    [b'\n', after @ ..] => rest = after,
                    [] => self.after_cr = true,
                    _ => {}
                }
            }
            *chunk = rest;
            if !self.line.is_empty() {
                // The line began in an earlier chunk.
                self.line.extend_from_slice(head);
                self.check_len()?;
                let line = std::mem::take(&mut self.line);
                let read = self.line_held(&line);
                self.line = reuse(line);
                read?;
                continue;
            }
            if head.len() > self.limit {
                return Err(SseError::TooLong { limit: self.limit });
            }
            match read_line(head) {
                Line::Blank if self.has_data => {
                    return Ok(Some(match in_place {
                        Some(data) => SseEvent {
                            data,
                            multiline: self.end_event(),
                        },
                        None => self.held_event(),
                    }));
                }
                Line::Data(value) => match (self.has_data, std::str::from_utf8(value)) {
                    (false, Ok(text)) => {
                        in_place = Some(text);
                        self.has_data = true;
                    }
                    (_, text) => {
                        if let Some(first) = in_place.take() {
                            self.data.push_str(first);
                        }
                        self.push_data(value, text.ok())?;
                    }
                },
                Line::Blank | Line::Skipped => {}
            }
        }
    }

    /// End of stream: the last event, when its blank line never came (a
    /// provider ending on `data: [DONE]\n` is common enough).
    pub fn finish(&mut self) -> Result<Option<SseEvent<'_>>, SseError> {
        if std::mem::take(&mut self.data_handed_out) {
            self.data.clear();
        }
        self.after_cr = false;
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            let read = self.line_held(&line);
            self.line = reuse(line);
            read?;
        }
        Ok(self.has_data.then(|| self.held_event()))
    }

    /// Bytes held while waiting for the rest of a line or event.
    pub fn pending(&self) -> usize {
        let handed_out = if self.data_handed_out { self.data.len() } else { 0 };
        self.line.len() + self.data.len() - handed_out
    }

    fn check_len(&self) -> Result<(), SseError> {
        if self.line.len() > self.limit {
            return Err(SseError::TooLong { limit: self.limit });
        }
        Ok(())
    }

    /// A complete line that was assembled across chunks (so not blank):
    /// its data is copied.
    fn line_held(&mut self, line: &[u8]) -> Result<(), SseError> {
        match read_line(line) {
            Line::Data(value) => self.push_data(value, std::str::from_utf8(value).ok()),
            Line::Blank | Line::Skipped => Ok(()),
        }
    }

    /// Appends one data line's value (`text` when it is valid UTF-8; the
    /// rest is decoded with replacement characters).
    fn push_data(&mut self, value: &[u8], text: Option<&str>) -> Result<(), SseError> {
        if self.has_data {
            self.data.push('\n');
            self.multiline = true;
        }
        match text {
            Some(text) => self.data.push_str(text),
            None => self.data.push_str(&String::from_utf8_lossy(value)),
        }
        self.has_data = true;
        if self.data.len() > self.limit {
            return Err(SseError::TooLong { limit: self.limit });
        }
        Ok(())
    }

    /// The event ends, and the next starts: whether it had several data lines.
    fn end_event(&mut self) -> bool {
        self.has_data = false;
        std::mem::take(&mut self.multiline)
    }

    /// The event assembled in `data` ends, and is handed out.
    fn held_event(&mut self) -> SseEvent<'_> {
        let multiline = self.end_event();
        self.data_handed_out = true;
        SseEvent {
            data: &self.data,
            multiline,
        }
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

    /// An event as the tests compare them: its data and whether it was multiline.
    type Owned = (String, bool);

    /// Every event `chunk` completes, owned.
    pub fn push(d: &mut SseDecoder, mut chunk: &[u8], out: &mut Vec<Owned>) -> Result<(), SseError> {
        while let Some(event) = d.next(&mut chunk)? {
            out.push((event.data.to_string(), event.multiline));
        }
        Ok(())
    }

    fn decode_all(input: &[u8]) -> Vec<Owned> {
        let mut reference: Option<Vec<Owned>> = None;
        for chunks in chunkings(input) {
            let mut d = SseDecoder::default();
            let mut out = Vec::new();
            for c in &chunks {
                push(&mut d, c, &mut out).unwrap();
            }
            if let Some(last) = d.finish().unwrap() {
                out.push((last.data.to_string(), last.multiline));
            }
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

    fn ev(data: &str) -> Owned {
        (data.to_string(), data.contains('\n'))
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
        push(&mut d, b"data: a\r", &mut out).unwrap();
        push(&mut d, b"\ndata: b\r\n\r\n", &mut out).unwrap();
        assert_eq!(out, vec![ev("a\nb")]);
    }

    #[test]
    fn split_utf8_characters_survive() {
        let input = "data: {\"t\":\"héllo ✓ 🎉\"}\n\n".as_bytes();
        assert_eq!(decode_all(input), vec![ev("{\"t\":\"héllo ✓ 🎉\"}")]);
    }

    #[test]
    fn events_read_in_place_and_assembled_agree() {
        // In one chunk each event is read in place, or copied when it must
        // be (a second data line, bytes that are not UTF-8); split anywhere,
        // some are assembled across chunks: the same events either way.
        let input = b"data: \xff!\n\ndata: a\nid: 1\n\ndata: b\ndata: c\n\n: x\ndata: d\r\n\r\ndata: e";
        let expect = vec![ev("\u{fffd}!"), ev("a"), ev("b\nc"), ev("d"), ev("e")];
        assert_eq!(decode_all(input), expect);
    }

    #[test]
    fn only_line_feeds_and_carriage_returns_end_lines() {
        // Other control characters, a vertical tab and a form feed
        // included, are the line's.
        let input = b"data: a\tb\x0bc\x0cd\x00e\x01\n\ndata: \t\r\n\r\n";
        assert_eq!(decode_all(input), vec![ev("a\tb\u{b}c\u{c}d\u{0}e\u{1}"), ev("\t")]);
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
        push(&mut d, b"data: 0123456789", &mut out).unwrap();
        assert_eq!(push(&mut d, b"abcdef", &mut out), Err(SseError::TooLong { limit: 16 }));
    }

    #[test]
    fn writer_frames_data() {
        let mut out = Vec::new();
        write_data(&mut out, b"{}");
        assert_eq!(out, b"data: {}\n\n");
    }
}
