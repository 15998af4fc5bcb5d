//! What the fuzz targets of the network-facing parsers check on one input
//! (`fuzz/fuzz_targets/`, run with cargo-fuzz; see `docs/fuzzing.md`). Each
//! function panics when the parser misbehaves. The targets call them, and
//! `tests/fuzz_corpus.rs` replays each target's committed corpus
//! (`fuzz/corpus/TARGET/`) through them on the stable toolchain. Not an API:
//! hidden from the documentation, free to change with the targets.

use crate::sse::{self, SseParser};

/// `sse_stream`: any bytes as a response body. The first byte picks where
/// the rest is cut into pieces; [`SseParser`] gives the same events fed
/// whole, in those pieces and byte by byte, and they are the events of a
/// plain reading of the rules (the reference below). Every event reads as
/// a chunk without panicking, and the chunk reader's fast path agrees with
/// serde_json on it.
pub fn sse_stream(data: &[u8]) {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let expected = reference_events(body);
    assert_eq!(events(&[body]), expected, "fed whole");
    let pieces = pieces(body, seed);
    assert_eq!(events(&pieces), expected, "fed in pieces (seed {seed})");
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(events(&bytes), expected, "fed byte by byte");
    for event in &expected {
        let _ = sse::parse_chunk(event);
        sse::check_fast_path(event);
    }
}

/// `sse_chunk`: any bytes as one event payload. The fast path of
/// [`sse::parse_chunk`] either leaves the payload to serde_json or reads
/// exactly what serde_json reads.
pub fn sse_chunk(data: &[u8]) {
    let _ = sse::parse_chunk(data);
    sse::check_fast_path(data);
}

/// `http_response`: a response head and body from any bytes, read whole or
/// in pieces (the same outcome), a chunked body encoded from the input and
/// read back exactly, or a `Retry-After` value (see `http/fuzz.rs`).
pub fn http_response(data: &[u8]) {
    crate::http::fuzz::response(data);
}

fn events(pieces: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    for piece in pieces {
        parser.feed(piece, |e| out.push(e.to_vec()));
    }
    parser.finish(|e| out.push(e.to_vec()));
    out
}

/// `body` cut into pieces of 1 to 16 bytes, sizes drawn from `seed`.
fn pieces(body: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        // xorshift32: any sequence will do, as long as it is the seed's.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let (piece, after) = rest.split_at((state as usize % 16 + 1).min(rest.len()));
        out.push(piece);
        rest = after;
    }
    out
}

/// The SSE rules as [`SseParser`] documents them, read the slow way: split
/// the whole body into lines (`\r\n`, `\n` or `\r`; a last line without
/// its end counts), join each event's `data:` values with `\n`, deliver
/// it at a blank line or at the end of the body.
fn reference_events(body: &[u8]) -> Vec<Vec<u8>> {
    let mut lines = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < body.len() {
        match body[i] {
            b'\n' => {
                lines.push(&body[start..i]);
                i += 1;
                start = i;
            }
            b'\r' => {
                lines.push(&body[start..i]);
                i += if body.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                start = i;
            }
            _ => i += 1,
        }
    }
    if start < body.len() {
        lines.push(&body[start..]);
    }
    let mut events = Vec::new();
    let mut data: Option<Vec<u8>> = None;
    for line in lines {
        if line.is_empty() {
            events.extend(data.take());
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        if field == b"data" {
            match &mut data {
                Some(joined) => {
                    joined.push(b'\n');
                    joined.extend_from_slice(value);
                }
                None => data = Some(value.to_vec()),
            }
        }
    }
    events.extend(data);
    events
}
