//! When response bytes arrived on this host: a TCP stream read with
//! `recvmsg` and Linux's `SO_TIMESTAMPING`, so that the kernel reports when
//! it received the data each read returns.
//!
//! A client busy with thousands of streams (or sharing cores with the
//! server) reads a chunk some time after it arrived; timing chunks at the
//! read would add the client's own delay to TTFT and inter-chunk latencies.
//! Elsewhere, when the kernel refuses the option, and for the first packets
//! after a process turns it on (the kernel enables timestamping
//! asynchronously), the stream reports nothing and the read instant is used
//! instead.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP stream that remembers when the bytes of its latest read arrived.
#[derive(Debug)]
pub struct ArrivalStream {
    tcp: TcpStream,
    /// Whether the kernel timestamps received data for this socket.
    timestamped: bool,
    arrived: Option<SystemTime>,
    /// Room for one control message, reused by every read.
    control: Vec<u8>,
}

impl ArrivalStream {
    pub fn new(tcp: TcpStream) -> Self {
        #[cfg(target_os = "linux")]
        let (timestamped, control) = {
            use nix::sys::socket::{TimestampingFlag, setsockopt, sockopt};
            let flags = TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE
                | TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE;
            let timestamped = setsockopt(&tcp, sockopt::Timestamping, &flags).is_ok();
            (timestamped, nix::cmsg_space!(nix::sys::socket::Timestamps))
        };
        #[cfg(not(target_os = "linux"))]
        let (timestamped, control) = (false, Vec::new());
        ArrivalStream {
            tcp,
            timestamped,
            arrived: None,
            control,
        }
    }

    /// When the kernel received the bytes of the latest read that returned
    /// any; `None` when unknown (no timestamping, or not dated by the kernel).
    pub fn arrived(&self) -> Option<SystemTime> {
        self.arrived
    }
}

impl AsyncRead for ArrivalStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.timestamped {
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        }
        #[cfg(target_os = "linux")]
        loop {
            std::task::ready!(this.tcp.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let room = unfilled.len();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&this.tcp);
            let control = &mut this.control;
            let mut short = None;
            let result = this.tcp.try_io(tokio::io::Interest::READABLE, || {
                let read = receive(fd, unfilled, control)?;
                if read.0 > 0 && read.0 < room {
                    // A short read drained the socket: say "would block" so
                    // that tokio forgets the readiness now (its own reads do
                    // the same) rather than after one more syscall.
                    short = Some(read);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(read)
            });
            let (n, arrived) = match (result, short) {
                (Ok(read), _) | (Err(_), Some(read)) => read,
                (Err(err), None) if err.kind() == io::ErrorKind::WouldBlock => continue,
                (Err(err), None) => return Poll::Ready(Err(err)),
            };
            buf.advance(n);
            if n > 0 {
                // `None` for bytes the kernel did not date: never an older read's time.
                this.arrived = arrived;
            }
            return Poll::Ready(Ok(()));
        }
        #[cfg(not(target_os = "linux"))]
        unreachable!("timestamping is only turned on on Linux")
    }
}

/// One `recvmsg` into `into`: the bytes read and, when the kernel says, when
/// it received them.
#[cfg(target_os = "linux")]
fn receive(
    fd: std::os::fd::RawFd,
    into: &mut [u8],
    control: &mut Vec<u8>,
) -> io::Result<(usize, Option<SystemTime>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut iov = [io::IoSliceMut::new(into)];
    let message = recvmsg::<()>(fd, &mut iov, Some(control), MsgFlags::empty())?;
    let mut arrived = None;
    for cmsg in message.cmsgs() {
        if let ControlMessageOwned::ScmTimestampsns(stamps) = cmsg {
            let since_epoch = std::time::Duration::new(
                stamps.system.tv_sec().try_into().unwrap_or(0),
                stamps.system.tv_nsec().try_into().unwrap_or(0),
            );
            // An all-zero stamp means "no software timestamp".
            if !since_epoch.is_zero() {
                arrived = Some(SystemTime::UNIX_EPOCH + since_epoch);
            }
        }
    }
    Ok((message.bytes, arrived))
}

impl AsyncWrite for ArrivalStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Bytes that waited in the socket are dated when they arrived, not when
    /// they were read.
    #[tokio::test]
    async fn reads_are_dated_by_their_arrival() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut client = ArrivalStream::new(TcpStream::connect(address).await.unwrap());
        assert!(client.timestamped, "SO_TIMESTAMPING refused");
        let (mut server, _) = listener.accept().await.unwrap();
        let mut piece = [0u8; 64];

        // The kernel turns receive timestamping on asynchronously (a
        // deferred static key) when the first socket asks for it: packets
        // that arrive before then carry none. Wait for the first that does.
        for _ in 0..400 {
            server.write_all(b"w").await.unwrap();
            assert_eq!(client.read(&mut piece).await.unwrap(), 1);
            if client.arrived().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let warmed_up = client.arrived().expect("no timestamped packet within 2 s");

        server.write_all(b"first").await.unwrap();
        // Once the socket is readable the bytes have arrived; they then wait
        // there while the client is busy.
        client.tcp.readable().await.unwrap();
        let ready = SystemTime::now();
        std::thread::sleep(Duration::from_millis(50));
        let n = client.read(&mut piece).await.unwrap();
        assert_eq!(&piece[..n], b"first");
        let arrived = client.arrived().unwrap();
        assert!(
            warmed_up < arrived && arrived <= ready,
            "{arrived:?} after {ready:?}"
        );
        let waited = SystemTime::now().duration_since(arrived).unwrap();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");

        // A later read carries its own, later arrival; the end of the stream
        // (no bytes) keeps the last one.
        server.write_all(b"second").await.unwrap();
        drop(server);
        let n = client.read(&mut piece).await.unwrap();
        assert_eq!(&piece[..n], b"second");
        let second = client.arrived().unwrap();
        assert!(second > arrived, "{second:?} not after {arrived:?}");
        assert_eq!(client.read(&mut piece).await.unwrap(), 0);
        assert_eq!(client.arrived(), Some(second));
    }
}
