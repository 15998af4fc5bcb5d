//! A connection whose server side is a script: each read returns the next
//! piece of the script (as much as fits), then end of stream, and every
//! write is accepted. The fuzz checks and the transport's unit tests read
//! responses through it without a socket.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connection::{Connection, Io};

pub(super) struct Scripted {
    reads: VecDeque<Vec<u8>>,
    /// Slept before every read but the first, so that reads land at
    /// different instants (zero for the fuzz checks, which must not wait).
    pause_between_reads: Duration,
    started: bool,
}

impl Scripted {
    pub(super) fn connection(reads: Vec<Vec<u8>>, pause_between_reads: Duration) -> Connection {
        Connection::new(Box::new(Scripted {
            reads: reads.into(),
            pause_between_reads,
            started: false,
        }))
    }
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if std::mem::replace(&mut self.started, true) && !self.pause_between_reads.is_zero() {
            std::thread::sleep(self.pause_between_reads);
        }
        if let Some(mut piece) = self.reads.pop_front() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                self.reads.push_front(piece.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Io for Scripted {
    fn arrived(&self) -> Option<SystemTime> {
        None
    }
}
