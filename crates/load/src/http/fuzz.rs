//! The checks of the `http_response` fuzz target (`fuzz/`), replayed on its
//! corpus by `tests/fuzz_corpus.rs`: a response read from any bytes, whole
//! or in pieces, and a `Retry-After` value. Each panics when the reader
//! misbehaves. Reached through [`crate::fuzz_check`].

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use super::connection::Unanswered;
use super::response::retry_after;
use super::scripted::Scripted;

/// The first byte picks the check: the rest read as a whole response
/// (split into pieces by that byte), as a chunked body to encode and read
/// back, or as a `Retry-After` value.
pub(crate) fn response(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 | 1 => any_bytes(rest, mode),
        2 => chunked_round_trip(rest),
        _ => retry_after_value(rest),
    }
}

/// What reading a response gave, as far as it must not depend on how its
/// bytes were split into reads.
#[derive(Debug, PartialEq)]
struct Read {
    status: u16,
    /// Whether a `Retry-After` was read (a date's wait depends on the clock).
    retry_after: bool,
    body: Vec<u8>,
}

/// How reading failed: whether any byte came back, and the message.
#[derive(Debug, PartialEq)]
enum Failed {
    Silent(String),
    Answered(String),
    Body(String),
}

/// Any bytes as a server's answer: read whole, in pieces of sizes drawn
/// from `seed` and byte by byte, the outcome is the same. A connection is
/// reusable when read whole only if it is when read in pieces (pieces may
/// leave unasked bytes unread, never the reverse), and only a busy
/// server's answer carries a `Retry-After`.
fn any_bytes(bytes: &[u8], seed: u8) {
    let (whole, reusable) = read(vec![bytes.to_vec()]);
    for reads in [
        pieces(bytes, seed),
        bytes.chunks(1).map(<[u8]>::to_vec).collect(),
    ] {
        let (split, split_reusable) = read(reads);
        assert_eq!(
            split, whole,
            "pieces (seed {seed}) read otherwise than whole"
        );
        assert!(
            !reusable || split_reusable,
            "reusable read whole, not in pieces"
        );
    }
    if let Ok(read) = &whole {
        assert!(
            !read.retry_after || matches!(read.status, 429 | 503),
            "Retry-After on a {}",
            read.status
        );
    }
}

/// `body` cut into chunks (their sizes and the spelling of each size line
/// drawn from its own bytes), with extensions and a trailer: the body reads
/// back exactly, whole and in pieces, and the connection is reusable.
fn chunked_round_trip(plan: &[u8]) {
    let mut wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let mut body = Vec::new();
    let mut rest = plan;
    while let Some((&shape, after)) = rest.split_first() {
        let size = usize::from(shape & 0x3f).min(after.len());
        let (chunk, after) = after.split_at(size);
        rest = after;
        if size == 0 {
            continue;
        }
        let line = match shape >> 6 {
            0 => format!("{size:x}"),
            1 => format!("{size:X}"),
            2 => format!("00{size:x}"),
            _ => format!("{size:x};name=\"v\";flag"),
        };
        wire.extend_from_slice(line.as_bytes());
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
        body.extend_from_slice(chunk);
    }
    wire.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
    let seed = plan.first().copied().unwrap_or(0);
    for reads in [vec![wire.clone()], pieces(&wire, seed)] {
        let (outcome, reusable) = read(reads);
        let read = outcome.unwrap_or_else(|e| panic!("a well-formed chunked body failed: {e:?}"));
        assert_eq!(read.body, body, "the chunked body read back otherwise");
        assert!(
            reusable,
            "a whole chunked response left the connection unusable"
        );
    }
}

/// A `Retry-After` value: a number of seconds is read as exactly that, and
/// nothing else is read unless it is an HTTP date, never further than that
/// date is.
fn retry_after_value(value: &[u8]) {
    let header = [httparse::Header {
        name: "Retry-After",
        value,
    }];
    let before = SystemTime::now();
    let read = retry_after(&header);
    let text = std::str::from_utf8(value).ok().map(str::trim);
    if let Some(seconds) = text.and_then(|t| t.parse::<u64>().ok()) {
        assert_eq!(read, Some(Duration::from_secs(seconds)));
    } else if let Some(wait) = read {
        let date = text
            .and_then(|t| httpdate::parse_http_date(t).ok())
            .unwrap_or_else(|| panic!("read {wait:?} from {text:?}, neither seconds nor a date"));
        let longest = date.duration_since(before).unwrap_or(Duration::ZERO);
        assert!(wait <= longest, "{wait:?} beyond the date ({longest:?})");
    }
}

/// `bytes` cut into pieces of 1 to 32 bytes, sizes drawn from `seed`.
fn pieces(bytes: &[u8], seed: u8) -> Vec<Vec<u8>> {
    let mut state = u32::from(seed) | 0x100;
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        // xorshift32: any sequence will do, as long as it is the seed's.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let size = (state % 32) as usize + 1;
        let (piece, after) = rest.split_at(size.min(rest.len()));
        out.push(piece.to_vec());
        rest = after;
    }
    out
}

/// Reads a whole response from `reads`: what it said, and whether the
/// connection could carry another request.
fn read(reads: Vec<Vec<u8>>) -> (Result<Read, Failed>, bool) {
    now(async {
        let connection = Scripted::connection(reads, Duration::ZERO);
        let mut response = match connection.read_response().await {
            Ok(response) => response,
            Err(Unanswered::Silent(e)) => return (Err(Failed::Silent(e.to_string())), false),
            Err(Unanswered::Answered(e)) => return (Err(Failed::Answered(e.to_string())), false),
        };
        let (body, total) = match response.collect(usize::MAX).await {
            Ok(read) => read,
            Err(e) => return (Err(Failed::Body(e.to_string())), false),
        };
        assert_eq!(body.len(), total, "collect kept less than it read");
        let read = Read {
            status: response.status,
            retry_after: response.retry_after.is_some(),
            body,
        };
        (Ok(read), response.reusable())
    })
}

/// Runs a future that never waits (every read of a [`Scripted`] connection is ready).
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("a replayed response waited"),
    }
}
