//! One keep-alive connection: its socket (TCP or TLS over TCP, each read
//! dated by when its bytes arrived, see `arrival.rs`), its read buffer,
//! and writing a request into it.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::arrival::ArrivalStream;
use super::{HttpError, MAX_BUFFER, Response};

/// Read buffer of a connection: a response head and a few SSE events. It
/// grows only for a line longer than it (up to [`MAX_BUFFER`]), and stays
/// small since every stream holds one: 16,384 streams hold 16 MiB of them.
/// (A read that fills it does not grow it: under overload every stream's
/// bytes pile up, and grown buffers took 2-3x the memory.)
const READ_BUFFER: usize = 1024;

/// Why an exchange on a connection got no response.
pub(super) enum Unanswered {
    /// Not one byte came back: the server may have closed the connection
    /// before the request reached it.
    Silent(HttpError),
    /// The server answered (part of a head), or the failure was ours.
    Answered(HttpError),
}

impl Unanswered {
    pub(super) fn into_error(self) -> HttpError {
        match self {
            Unanswered::Silent(error) | Unanswered::Answered(error) => error,
        }
    }
}

/// What a connection reads and writes: a TCP stream, or TLS over one.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send {
    /// When the bytes of the latest read arrived on this host, if known.
    fn arrived(&self) -> Option<SystemTime>;
}

impl Io for ArrivalStream {
    fn arrived(&self) -> Option<SystemTime> {
        ArrivalStream::arrived(self)
    }
}

impl Io for tokio_rustls::client::TlsStream<ArrivalStream> {
    fn arrived(&self) -> Option<SystemTime> {
        self.get_ref().0.arrived()
    }
}

/// One keep-alive connection and its read buffer.
pub(super) struct Connection {
    pub(super) io: Box<dyn Io>,
    pub(super) buffer: Vec<u8>,
    /// Bytes received but not consumed yet: `buffer[start..end]`.
    pub(super) start: usize,
    pub(super) end: usize,
    /// When the bytes of the latest read arrived (else when it returned).
    pub(super) received_at: Instant,
    /// The longest a read of the current response returned after its bytes
    /// had arrived (known only from kernel timestamps).
    pub(super) lag: Option<Duration>,
    /// Whether any byte of an answer to the current request came back.
    pub(super) answered: bool,
    pub(super) idle_since: Instant,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Connection {
    pub(super) fn new(io: Box<dyn Io>) -> Self {
        let now = Instant::now();
        Connection {
            io,
            buffer: vec![0; READ_BUFFER],
            start: 0,
            end: 0,
            received_at: now,
            lag: None,
            answered: false,
            idle_since: now,
        }
    }

    /// Writes `request` and reads the response head.
    pub(super) async fn exchange(mut self, request: &[u8]) -> Result<Response, Unanswered> {
        self.lag = None;
        self.answered = false;
        let written = async {
            self.io.write_all(request).await?;
            self.io.flush().await
        };
        if let Err(error) = written.await {
            return Err(Unanswered::Silent(error.into()));
        }
        self.read_response().await
    }

    pub(super) fn buffered(&self) -> &[u8] {
        &self.buffer[self.start..self.end]
    }

    /// Reads more bytes after those buffered; `Ok(false)` at the end of the stream.
    pub(super) async fn read_more(&mut self) -> Result<bool, HttpError> {
        if self.end == self.buffer.len() {
            if self.start > 0 {
                self.buffer.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.buffer.len() < MAX_BUFFER {
                self.buffer
                    .resize((self.buffer.len() * 2).min(MAX_BUFFER), 0);
            } else {
                return Err(HttpError::Protocol(format!(
                    "a response head or chunk-size line longer than {} KiB",
                    MAX_BUFFER / 1024
                )));
            }
        }
        let n = self.io.read(&mut self.buffer[self.end..]).await?;
        let read_at = Instant::now();
        self.received_at = match self.io.arrived() {
            Some(arrived) => {
                let at = instant_of(arrived, read_at);
                let lag = read_at.saturating_duration_since(at);
                self.lag = Some(self.lag.map_or(lag, |l| l.max(lag)));
                at
            }
            None => read_at,
        };
        self.end += n;
        self.answered |= n > 0;
        Ok(n > 0)
    }

    /// Consumes `n` buffered bytes.
    pub(super) fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Consumes a buffered line (up to `\n`) and returns `read` of it
    /// without its line ending; `None` when no whole line is buffered.
    pub(super) fn take_line<T>(&mut self, read: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let at = memchr::memchr(b'\n', self.buffered())?;
        let line = &self.buffered()[..at];
        let value = read(line.strip_suffix(b"\r").unwrap_or(line));
        self.consume(at + 1);
        Some(value)
    }
    /// Whether an idle connection can carry another request: the server has
    /// not closed it and sent nothing unasked (checked without waiting).
    pub(super) fn is_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut probe),
            Poll::Pending
        )
    }
}

/// The [`Instant`] of a wall-clock time in the recent past (`now` is the
/// instant of the present).
fn instant_of(time: SystemTime, now: Instant) -> Instant {
    match SystemTime::now().duration_since(time) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        Err(_) => now, // in the future: the clock stepped back
    }
}
