//! Reading a response head (parsed by `httparse`): the status, a busy
//! server's `Retry-After`, the body's framing and whether the connection
//! stays open (RFC 9112); interim `1xx` heads are skipped. The [`Response`]
//! hands the body out piece by piece.

use std::time::{Duration, Instant, SystemTime};

use super::body::{Body, Chunk};
use super::connection::{Connection, Unanswered};
use super::{HttpError, MAX_HEADERS};

impl Connection {
    /// Reads a response head; the body is left to [`Response::next_piece`].
    pub(super) async fn read_response(mut self) -> Result<Response, Unanswered> {
        match self.read_head().await {
            Ok(head) => Ok(Response {
                status: head.status,
                retry_after: head.retry_after,
                resent: false,
                body: head.body,
                keep_alive: head.keep_alive,
                connection: self,
            }),
            Err(error) if !self.answered && !matches!(error, HttpError::Protocol(_)) => {
                Err(Unanswered::Silent(error))
            }
            Err(error) => Err(Unanswered::Answered(error)),
        }
    }

    async fn read_head(&mut self) -> Result<Head, HttpError> {
        loop {
            if let Some(head) = self.parse_head()? {
                return Ok(head);
            }
            if !self.read_more().await? {
                return Err(HttpError::Closed(if self.start == self.end {
                    "before answering"
                } else {
                    "in the middle of the response head"
                }));
            }
        }
    }

    /// The final response head if it is buffered (interim `1xx` heads are
    /// consumed and skipped). Not async on purpose: the parser's header
    /// array (2 KiB) lives on the stack, not in every request's future.
    fn parse_head(&mut self) -> Result<Option<Head>, HttpError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            let length = match response.parse(self.buffered()) {
                Ok(httparse::Status::Complete(length)) => length,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(err) => return Err(HttpError::Protocol(format!("response head: {err}"))),
            };
            let status = response.code.unwrap_or(0);
            let version = response.version.unwrap_or(1);
            let (body, keep_alive) = framing(status, version, response.headers)?;
            let retry_after = match status {
                429 | 503 => retry_after(response.headers),
                _ => None,
            };
            self.consume(length);
            // Interim responses (`100 Continue`) precede the real one.
            if !(100..200).contains(&status) || status == 101 {
                return Ok(Some(Head {
                    status,
                    retry_after,
                    body,
                    keep_alive,
                }));
            }
        }
    }
}

/// A response head, as far as the client uses it.
struct Head {
    status: u16,
    retry_after: Option<Duration>,
    body: Body,
    keep_alive: bool,
}

/// The body framing and whether the connection stays open after the
/// response, from its head (RFC 9112 §6.3, §9.3).
fn framing(
    status: u16,
    version: u8,
    headers: &[httparse::Header<'_>],
) -> Result<(Body, bool), HttpError> {
    let mut chunked = None;
    let mut length: Option<u64> = None;
    let mut close = version == 0;
    for header in headers {
        let value = String::from_utf8_lossy(header.value);
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(',').next().unwrap_or("").trim();
            chunked = Some(last.eq_ignore_ascii_case("chunked"));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let parsed: u64 = value
                .trim()
                .parse()
                .map_err(|_| HttpError::Protocol(format!("Content-Length {value:?}")))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(HttpError::Protocol(
                    "two different Content-Length headers".into(),
                ));
            }
            length = Some(parsed);
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    close = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && version == 0 {
                    close = false;
                }
            }
        }
    }
    let body = if matches!(status, 100..=199 | 204 | 304) {
        Body::Done
    } else {
        match (chunked, length) {
            (Some(true), _) => Body::Chunked(Chunk::Size),
            (Some(false), _) => Body::UntilClose,
            (None, Some(length)) => Body::Length(length),
            (None, None) => Body::UntilClose,
        }
    };
    // Both framings at once may be an attempt at request smuggling: read
    // the chunked body, then close (RFC 9112 §6.3). After a 101 the
    // connection speaks another protocol.
    let ambiguous = chunked.is_some() && length.is_some();
    Ok((
        body,
        !close && !ambiguous && status != 101 && body != Body::UntilClose,
    ))
}

/// A `Retry-After` header: seconds, or an HTTP date (RFC 9110 §10.2.3).
pub(super) fn retry_after(headers: &[httparse::Header<'_>]) -> Option<Duration> {
    let header = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("retry-after"))?;
    let value = std::str::from_utf8(header.value).ok()?.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            Some(
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO),
            )
        }
    }
}

/// A response whose head was read; its body is read piece by piece.
pub struct Response {
    pub status: u16,
    /// `Retry-After` of a 429 or 503.
    pub retry_after: Option<Duration>,
    /// The request was sent again on a new connection (see [`Target::send`](super::Target::send)).
    pub resent: bool,
    pub(super) body: Body,
    pub(super) keep_alive: bool,
    pub(super) connection: Connection,
}

impl Response {
    /// When the bytes of the latest read arrived: after the last piece, the
    /// arrival of the end of the response.
    pub fn received_at(&self) -> Instant {
        self.connection.received_at
    }

    /// The longest any read of this response returned after its bytes had
    /// arrived: how far the client lagged behind (`None` without kernel
    /// receive timestamps).
    pub fn lag(&self) -> Option<Duration> {
        self.connection.lag
    }

    /// The next piece of the body and when it was read from the socket
    /// (pieces of one read share its instant); `None` at the end of the body.
    pub async fn next_piece(&mut self) -> Result<Option<(Instant, &[u8])>, HttpError> {
        match self.connection.next_piece(&mut self.body).await? {
            Some(range) => Ok(Some((
                self.connection.received_at,
                &self.connection.buffer[range],
            ))),
            None => Ok(None),
        }
    }

    /// Reads the rest of the body, keeping at most `limit` bytes of it;
    /// returns them and the body's total length.
    pub async fn collect(&mut self, limit: usize) -> Result<(Vec<u8>, usize), HttpError> {
        let mut kept = Vec::new();
        let mut total = 0;
        while let Some((_, piece)) = self.next_piece().await? {
            total += piece.len();
            let room = limit.saturating_sub(kept.len());
            kept.extend_from_slice(&piece[..piece.len().min(room)]);
        }
        Ok((kept, total))
    }

    /// Whether the body was read to the end, nothing unasked followed it and
    /// the server keeps the connection open.
    pub(super) fn reusable(&self) -> bool {
        self.body == Body::Done && self.keep_alive && self.connection.start == self.connection.end
    }
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::MAX_BUFFER;
    use crate::http::test_support::*;

    #[tokio::test]
    async fn broken_responses_say_what_broke() {
        let cases = [
            ("", "closed the connection before answering"),
            (
                "HTTP/1.1 200 OK\r\nContent-Le",
                "in the middle of the response head",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
                "before the end of the body",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc",
                "before the end of the body",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcdeXY",
                "chunk longer than its size",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "chunk-size line \"zz\"",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
                "chunk-size line",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                "Content-Length \"x\"",
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "two different",
            ),
            ("garbage\r\n\r\n", "response head"),
        ];
        for (text, expected) in cases {
            let err = read(one(text)).await.unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_BUFFER));
        let err = read(split(&huge, 8192)).await.unwrap_err().to_string();
        assert!(err.contains("longer than 64 KiB"), "{err}");
    }

    #[tokio::test]
    async fn ambiguous_framing_and_switched_protocols_are_never_reused() {
        let both = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        assert_eq!(read(one(both)).await.unwrap(), (200, b"ok".to_vec(), false));
        let switched =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        assert_eq!(read(one(switched)).await.unwrap(), (101, Vec::new(), false));
    }

    #[tokio::test]
    async fn retry_after_is_read_as_seconds_or_a_date() {
        let head = |status: u16, value: &str| {
            format!("HTTP/1.1 {status} Busy\r\nRetry-After: {value}\r\nContent-Length: 0\r\n\r\n")
        };
        let retry = |text: String| async move {
            scripted(one(&text))
                .read_response()
                .await
                .map_err(Unanswered::into_error)
                .unwrap()
                .retry_after
        };
        assert_eq!(retry(head(429, "3")).await, Some(Duration::from_secs(3)));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let wait = retry(head(503, &soon)).await.unwrap();
        assert!(
            wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert_eq!(retry(head(429, "soon")).await, None);
        // Only a busy server's answer carries one.
        assert_eq!(retry(head(500, "3")).await, None);
    }
}
