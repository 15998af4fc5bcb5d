//! Reading a response body piece by piece as its bytes arrive:
//! `Content-Length`, `chunked` (sizes, extensions, trailers) or until the
//! server closes the connection.

use std::ops::Range;

use super::HttpError;
use super::connection::Connection;

/// Where the response body stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Body {
    /// `Content-Length`: bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body ends when the server closes the connection.
    UntilClose,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk: bytes still to come.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
}

impl Connection {
    /// The next piece of the body as a range of the buffer; `None` at its end.
    pub(super) async fn next_piece(
        &mut self,
        body: &mut Body,
    ) -> Result<Option<Range<usize>>, HttpError> {
        loop {
            let available = (self.end - self.start) as u64;
            match *body {
                Body::Done => return Ok(None),
                Body::Length(0) => *body = Body::Done,
                Body::Length(left) | Body::Chunked(Chunk::Data(left)) if available > 0 => {
                    let take = left.min(available);
                    let range = self.start..self.start + take as usize;
                    self.consume(take as usize);
                    *body = match *body {
                        Body::Length(_) => Body::Length(left - take),
                        _ if take == left => Body::Chunked(Chunk::DataEnd),
                        _ => Body::Chunked(Chunk::Data(left - take)),
                    };
                    // `consume` may have reset the window to empty: the bytes
                    // stay in place until the next read.
                    return Ok(Some(range));
                }
                Body::UntilClose if available > 0 => {
                    let range = self.start..self.end;
                    self.consume(available as usize);
                    return Ok(Some(range));
                }
                Body::Chunked(Chunk::Size) => match self.take_line(chunk_size) {
                    Some(chunk) => *body = Body::Chunked(chunk?),
                    None => {
                        self.read_or_fail("in the middle of a chunk-size line")
                            .await?
                    }
                },
                Body::Chunked(Chunk::DataEnd) if available >= 2 => {
                    if self.buffered().starts_with(b"\r\n") {
                        self.consume(2);
                        *body = Body::Chunked(Chunk::Size);
                    } else {
                        return Err(HttpError::Protocol("a chunk longer than its size".into()));
                    }
                }
                Body::Chunked(Chunk::Trailers) => match self.take_line(<[u8]>::is_empty) {
                    Some(true) => *body = Body::Done,
                    Some(false) => {} // a trailer field: nothing to use in it
                    None => self.read_or_fail("in the middle of the trailers").await?,
                },
                Body::UntilClose => {
                    if !self.read_more().await? {
                        *body = Body::Done;
                    }
                }
                Body::Length(_) | Body::Chunked(Chunk::Data(_)) => {
                    self.read_or_fail("before the end of the body").await?;
                }
                Body::Chunked(Chunk::DataEnd) => {
                    self.read_or_fail("before the end of a chunk").await?;
                }
            }
        }
    }

    pub(super) async fn read_or_fail(&mut self, when: &'static str) -> Result<(), HttpError> {
        if self.read_more().await? {
            Ok(())
        } else {
            Err(HttpError::Closed(when))
        }
    }
}

/// Parses a chunk-size line (hex size, optional `;extensions`).
fn chunk_size(line: &[u8]) -> Result<Chunk, HttpError> {
    let digits = line.split(|&b| b == b';').next().unwrap_or(b"");
    let digits = std::str::from_utf8(digits).unwrap_or("").trim();
    let size = u64::from_str_radix(digits, 16).map_err(|_| {
        HttpError::Protocol(format!(
            "chunk-size line {:?}",
            String::from_utf8_lossy(line)
        ))
    })?;
    Ok(if size == 0 {
        Chunk::Trailers
    } else {
        Chunk::Data(size)
    })
}

#[cfg(test)]
mod tests {
    use crate::http::connection::Unanswered;
    use crate::http::test_support::*;

    const CHUNKED: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
        7\r\ndata: a\r\n\
        18;ext=1\r\n\ndata: {\"x\":1}\n\ndata: b\n\r\n\
        0\r\nx-trailer: t\r\n\r\n";
    const CHUNKED_BODY: &[u8] = b"data: a\ndata: {\"x\":1}\n\ndata: b\n";

    #[tokio::test]
    async fn chunked_bodies_whole_or_split_anywhere() {
        assert_eq!(
            read(one(CHUNKED)).await.unwrap(),
            (200, CHUNKED_BODY.to_vec(), true)
        );
        for size in [1, 2, 3, 5, 7, 11] {
            let got = read(split(CHUNKED, size)).await.unwrap();
            assert_eq!(got, (200, CHUNKED_BODY.to_vec(), true), "pieces of {size}");
        }
    }

    #[tokio::test]
    async fn content_length_until_close_and_no_body() {
        let sized = "HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!";
        assert_eq!(
            read(split(sized, 4)).await.unwrap(),
            (404, b"nope!".to_vec(), true)
        );
        let close = "HTTP/1.1 200 OK\r\n\r\ndata: a\n\ndata: b\n\n";
        assert_eq!(
            read(split(close, 9)).await.unwrap(),
            (200, b"data: a\n\ndata: b\n\n".to_vec(), false)
        );
        let closing = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(
            read(one(closing)).await.unwrap(),
            (200, b"ok".to_vec(), false)
        );
        let old = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert!(
            !read(one(old)).await.unwrap().2,
            "HTTP/1.0 without keep-alive"
        );
        let empty = "HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(read(one(empty)).await.unwrap(), (204, Vec::new(), true));
        let interim = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx";
        assert_eq!(
            read(split(interim, 6)).await.unwrap(),
            (200, b"x".to_vec(), true)
        );
    }

    #[tokio::test]
    async fn a_long_head_grows_the_buffer_a_large_body_does_not() {
        let body = "x".repeat(100_000);
        let text = format!(
            "HTTP/1.1 200 OK\r\nx-long: {}\r\nContent-Length: {}\r\n\r\n{body}",
            "h".repeat(3000),
            body.len()
        );
        // All bytes wait at once: the buffer grows for the head's long
        // line (to 4 KiB), not for the bytes piling up.
        let mut response = scripted(one(&text))
            .read_response()
            .await
            .map_err(Unanswered::into_error)
            .unwrap();
        let (read, total) = response.collect(usize::MAX).await.unwrap();
        assert_eq!((read, total), (body.clone().into_bytes(), body.len()));
        assert_eq!(response.connection.buffer.len(), 4 * 1024);
    }

    #[tokio::test]
    async fn pieces_of_one_read_share_its_instant() {
        let mut response = scripted(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n1\r\nb\r\n".to_vec(),
            b"1\r\nc\r\n0\r\n\r\n".to_vec(),
        ])
        .read_response()
        .await
        .map_err(Unanswered::into_error)
        .unwrap();
        let (a, _) = response.next_piece().await.unwrap().unwrap();
        let (b, _) = response.next_piece().await.unwrap().unwrap();
        let (c, _) = response.next_piece().await.unwrap().unwrap();
        assert_eq!(a, b);
        assert!(c > b, "the second read's instant");
        assert!(response.next_piece().await.unwrap().is_none());
    }
}
