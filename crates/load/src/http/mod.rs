//! The HTTP/1.1 transport under the client: one target server (origin and
//! base path), its pool of idle keep-alive connections, connecting (TCP with
//! `TCP_NODELAY`, TLS for `https`), writing a request and reading its
//! response head (parsed by `httparse`) and body (`Content-Length`,
//! `chunked` or until close).
//!
//! Why not a general-purpose client: a load generator holds one connection
//! per request in flight, thousands of them. hyper's client connection costs
//! about 34 KiB each (two 9 KiB blocks of the channel that hands it requests,
//! an 8 KiB read and an 8 KiB write buffer) plus a task, and every body chunk
//! crosses from the connection's task to the request's. Here a connection is
//! its socket and a 4 KiB read buffer, read by the request's own task; each
//! piece of a body is dated by when its bytes arrived (the kernel's receive
//! timestamp on Linux, see `arrival.rs`).
//!
//! A connection carries one request at a time and returns to the pool only
//! after its response was read to the end, so a run never holds more
//! connections than it had requests in flight. A request written into a
//! pooled connection that the server had closed meanwhile (no byte of an
//! answer came back) is sent once more on a new connection, and the
//! response says so. Proxies come from the environment (`proxy.rs`).

mod arrival;
mod proxy;

use std::ops::Range;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use http::header::HeaderMap;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use self::arrival::ArrivalStream;
pub use self::proxy::{Proxies, Proxy};
use crate::lock;

/// Read buffer of a new connection: several SSE events per read.
const READ_BUFFER: usize = 4 * 1024;
/// A response head or chunk-size line may grow the buffer up to this.
const MAX_BUFFER: usize = 64 * 1024;
/// Headers a response head may have.
const MAX_HEADERS: usize = 64;
/// Idle connections older than this are closed rather than reused: servers
/// close idle keep-alive connections after a few seconds (uvicorn, which
/// serves vLLM: 5 s), and a request written into a connection the server is
/// closing is lost.
const IDLE_LIMIT: Duration = Duration::from_secs(4);

/// Why a request got no (complete) response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {address}: {reason}")]
    Connect {
        address: String,
        reason: String,
        /// The client's own resources failed (see [`HttpError::is_client_side`]).
        client_side: bool,
    },
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server closed the connection {0}")]
    Closed(&'static str),
    #[error("invalid response: {0}")]
    Protocol(String),
    /// The pooled connection the request was written into had been closed
    /// by the server; the new connection it was sent on failed too.
    #[error("{0} (sent again on a new connection: the kept-alive one had been closed)")]
    Resent(Box<HttpError>),
}

impl HttpError {
    /// Whether the client itself failed (out of file descriptors, ports or
    /// buffers), not the server.
    pub fn is_client_side(&self) -> bool {
        match self {
            HttpError::Connect { client_side, .. } => *client_side,
            HttpError::Resent(inner) => inner.is_client_side(),
            _ => false,
        }
    }
}

/// Errors of this host's own resources (file descriptors, local ports,
/// buffers, memory) rather than of the server or the network.
fn is_client_side(error: &std::io::Error) -> bool {
    #[cfg(target_os = "linux")]
    {
        use nix::errno::Errno;
        let own = [
            Errno::EMFILE,
            Errno::ENFILE,
            Errno::ENOBUFS,
            Errno::ENOMEM,
            Errno::EADDRNOTAVAIL,
        ];
        error
            .raw_os_error()
            .is_some_and(|code| own.contains(&Errno::from_raw(code)))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = error;
        false
    }
}

/// The server one base URL (`http://host:port/v1`) points at.
#[derive(Debug)]
pub struct Target {
    /// The base URL as given, without a trailing slash (for messages).
    pub base: String,
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// The base URL's path without a trailing slash (`/v1`).
    prefix: String,
    /// Present for `https`.
    tls: Option<Tls>,
    /// The proxy the target is reached through, if any.
    proxy: Option<Proxy>,
    connect_timeout: Duration,
    /// Idle connections, most recently used last (reused first).
    idle: Mutex<Vec<Connection>>,
}

#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// A request rendered up to its `Content-Length`: method, path, `Host` and
/// the fixed headers, written once and copied in front of every body.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    head: Vec<u8>,
}

impl RequestTemplate {
    /// The complete request with `body`.
    pub fn with_body(&self, body: &[u8]) -> Vec<u8> {
        let mut request = Vec::with_capacity(self.head.len() + 32 + body.len());
        request.extend_from_slice(&self.head);
        request.extend_from_slice(b"content-length: ");
        request.extend_from_slice(body.len().to_string().as_bytes());
        request.extend_from_slice(b"\r\n\r\n");
        request.extend_from_slice(body);
        request
    }
}

impl Target {
    /// Parses a base URL such as `http://127.0.0.1:8000/v1`. An `https`
    /// target trusts the platform's certificate store plus `extra_roots`.
    /// `proxies` says whether it is reached through a proxy.
    pub fn new(
        base: &str,
        connect_timeout: Duration,
        extra_roots: &[CertificateDer<'static>],
        proxies: &Proxies,
    ) -> Result<Self, String> {
        let base = base.trim_end_matches('/');
        if !base.contains("://") {
            return Err("no scheme: write it as http://host:port/v1".into());
        }
        let uri: http::Uri = base.parse().map_err(|e| format!("not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(format!("unsupported scheme {other:?}: use http or https")),
            None => return Err("no scheme: write it as http://host:port/v1".into()),
        };
        let authority = uri
            .authority()
            .ok_or("no host: write it as http://host:port/v1")?;
        if authority.as_str().contains('@') {
            return Err(
                "user names and passwords in the URL are not supported: use --api-key or --header"
                    .into(),
            );
        }
        if uri.query().is_some() {
            return Err("a query string in the base URL is not supported".into());
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        // IPv6 literals come bracketed (`[::1]`): the Host header keeps the
        // brackets, the socket address does not.
        let host = authority.host();
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = if https {
            Some(Tls {
                connector: tls_connector(extra_roots)?,
                server_name: rustls::pki_types::ServerName::try_from(bare_host.clone())
                    .map_err(|e| format!("invalid TLS server name {bare_host:?}: {e}"))?,
            })
        } else {
            None
        };
        let proxy = proxies.for_target(https, &bare_host).cloned();
        Ok(Target {
            base: base.to_string(),
            host: bare_host,
            port,
            authority: authority.as_str().to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
            tls,
            proxy,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The origin-form path of `path` below the base URL (`chat/completions`
    /// -> `/v1/chat/completions`), or at the server's root when `path`
    /// starts with `/`.
    fn path(&self, path: &str) -> String {
        match path.strip_prefix('/') {
            Some(_) => path.to_string(),
            None => format!("{}/{path}", self.prefix),
        }
    }

    /// The request target of `path`: its origin form, or the absolute form
    /// (`http://host/v1/...`) when the request goes to an http proxy.
    fn request_target(&self, path: &str) -> String {
        match (&self.proxy, &self.tls) {
            (Some(_), None) => format!("http://{}{}", self.authority, self.path(path)),
            _ => self.path(path),
        }
    }

    /// The URL of `path` as requests resolve it, for messages.
    pub fn url(&self, path: &str) -> String {
        let root = self.base.strip_suffix(&self.prefix).unwrap_or(&self.base);
        format!("{root}{}", self.path(path))
    }

    /// A request template for `method` on `path` (see [`Target::url`]) with
    /// `headers` (already validated by [`http::HeaderMap`]).
    pub fn template(&self, method: &str, path: &str, headers: &HeaderMap) -> RequestTemplate {
        let mut head = Vec::with_capacity(256);
        for piece in [
            method,
            " ",
            &self.request_target(path),
            " HTTP/1.1\r\nhost: ",
            &self.authority,
            "\r\n",
        ] {
            head.extend_from_slice(piece.as_bytes());
        }
        if let (Some(proxy), None) = (&self.proxy, &self.tls)
            && let Some(authorization) = &proxy.authorization
        {
            head.extend_from_slice(b"proxy-authorization: ");
            head.extend_from_slice(authorization.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        for (name, value) in headers {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        RequestTemplate { head }
    }

    /// Writes `request` on an idle connection (or a new one) and reads the
    /// response head. Give the connection back with [`Response::finish`].
    ///
    /// A pooled connection may have been closed by the server just before
    /// the request went out (a keep-alive timeout racing the request): when
    /// no byte of an answer came back, the request is sent once more on a
    /// new connection ([`Response::resent`]).
    pub async fn send(&self, request: &[u8]) -> Result<Response, HttpError> {
        if let Some(pooled) = self.take_idle() {
            match pooled.exchange(request).await {
                Ok(response) => return Ok(response),
                Err(Unanswered::Silent(error)) => {
                    tracing::debug!(
                        "{}: pooled connection closed ({error}): sending again",
                        self.base
                    );
                }
                Err(Unanswered::Answered(error)) => return Err(error),
            }
            let connection = self
                .connect()
                .await
                .map_err(|e| HttpError::Resent(Box::new(e)))?;
            let mut response = connection
                .exchange(request)
                .await
                .map_err(|e| HttpError::Resent(Box::new(e.into_error())))?;
            response.resent = true;
            return Ok(response);
        }
        let connection = self.connect().await?;
        connection
            .exchange(request)
            .await
            .map_err(Unanswered::into_error)
    }

    fn take_idle(&self) -> Option<Connection> {
        let mut idle = lock(&self.idle);
        while let Some(mut connection) = idle.pop() {
            if connection.idle_since.elapsed() > IDLE_LIMIT {
                // The rest are older still.
                idle.clear();
                return None;
            }
            if connection.is_open() {
                return Some(connection);
            }
        }
        None
    }

    async fn connect(&self) -> Result<Connection, HttpError> {
        let (host, port) = match &self.proxy {
            Some(proxy) => (proxy.host.as_str(), proxy.port),
            None => (self.host.as_str(), self.port),
        };
        let address = match &self.proxy {
            Some(_) => format!("proxy {host}:{port} (for {}:{})", self.host, self.port),
            None => format!("{host}:{port}"),
        };
        let failed = |reason: String, client_side: bool| HttpError::Connect {
            address: address.clone(),
            reason,
            client_side,
        };
        let timeout = self.connect_timeout;
        let tcp = tokio::time::timeout(timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| failed(format!("timed out after {timeout:?}"), false))?
            .map_err(|e| failed(e.to_string(), is_client_side(&e)))?;
        // Without it, Nagle's algorithm and the server's delayed ACK add tens
        // of milliseconds to small requests.
        tcp.set_nodelay(true)
            .map_err(|e| failed(format!("cannot set TCP_NODELAY: {e}"), false))?;
        let mut tcp = ArrivalStream::new(tcp);
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(tls) => {
                // Boxed: the handshake's state is large and only new https
                // connections need it, not every request's future.
                let handshake = Box::pin(async {
                    if let Some(proxy) = &self.proxy {
                        self.tunnel(&mut tcp, proxy).await?;
                    }
                    tls.connector
                        .connect(tls.server_name.clone(), tcp)
                        .await
                        .map_err(|e| format!("TLS handshake failed: {e}"))
                });
                Box::new(
                    tokio::time::timeout(timeout, handshake)
                        .await
                        .map_err(|_| {
                            failed(format!("TLS handshake timed out after {timeout:?}"), false)
                        })?
                        .map_err(|reason| failed(reason, false))?,
                )
            }
        };
        Ok(Connection::new(io))
    }

    /// Asks the proxy on `tcp` for a tunnel to the target (`CONNECT`).
    async fn tunnel(&self, tcp: &mut ArrivalStream, proxy: &Proxy) -> Result<(), String> {
        let target = format!("{}:{}", self.authority_host(), self.port);
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n");
        if let Some(authorization) = &proxy.authorization {
            request.push_str(&format!("proxy-authorization: {authorization}\r\n"));
        }
        request.push_str("\r\n");
        let failed = |e: std::io::Error| format!("CONNECT through the proxy failed: {e}");
        tcp.write_all(request.as_bytes()).await.map_err(failed)?;
        // The answer is a head only; the TLS handshake starts after it, so
        // nothing follows it yet and it can be read byte by byte.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_BUFFER {
                return Err("the proxy's answer to CONNECT is too long".into());
            }
            let mut byte = [0u8; 1];
            if tcp.read(&mut byte).await.map_err(failed)? == 0 {
                return Err("the proxy closed the connection during CONNECT".into());
            }
            head.push(byte[0]);
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&head) {
            Ok(httparse::Status::Complete(_))
                if response.code.is_some_and(|c| (200..300).contains(&c)) =>
            {
                Ok(())
            }
            Ok(httparse::Status::Complete(_)) => Err(format!(
                "the proxy refused CONNECT {target}: HTTP {} {}",
                response.code.unwrap_or(0),
                response.reason.unwrap_or("")
            )),
            _ => Err("the proxy's answer to CONNECT is not HTTP".into()),
        }
    }

    /// The target's host as written in a `CONNECT` line (IPv6 bracketed).
    fn authority_host(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }
}

/// Why an exchange on a connection got no response.
enum Unanswered {
    /// Not one byte came back: the server may have closed the connection
    /// before the request reached it.
    Silent(HttpError),
    /// The server answered (part of a head), or the failure was ours.
    Answered(HttpError),
}

impl Unanswered {
    fn into_error(self) -> HttpError {
        match self {
            Unanswered::Silent(error) | Unanswered::Answered(error) => error,
        }
    }
}

/// What a connection reads and writes: a TCP stream, or TLS over one.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {
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
struct Connection {
    io: Box<dyn Io>,
    buffer: Vec<u8>,
    /// Bytes received but not consumed yet: `buffer[start..end]`.
    start: usize,
    end: usize,
    /// When the bytes of the latest read arrived (else when it returned).
    received_at: Instant,
    /// The longest a read of the current response returned after its bytes
    /// had arrived (known only from kernel timestamps).
    lag: Option<Duration>,
    /// Whether any byte of an answer to the current request came back.
    answered: bool,
    idle_since: Instant,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// Where the response body stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Body {
    /// `Content-Length`: bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body ends when the server closes the connection.
    UntilClose,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
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
    fn new(io: Box<dyn Io>) -> Self {
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
    async fn exchange(mut self, request: &[u8]) -> Result<Response, Unanswered> {
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

    fn buffered(&self) -> &[u8] {
        &self.buffer[self.start..self.end]
    }

    /// Reads more bytes after those buffered; `Ok(false)` at the end of the stream.
    async fn read_more(&mut self) -> Result<bool, HttpError> {
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
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Consumes a buffered line (up to `\n`) and returns `read` of it
    /// without its line ending; `None` when no whole line is buffered.
    fn take_line<T>(&mut self, read: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let at = memchr::memchr(b'\n', self.buffered())?;
        let line = &self.buffered()[..at];
        let value = read(line.strip_suffix(b"\r").unwrap_or(line));
        self.consume(at + 1);
        Some(value)
    }

    /// Reads a response head; the body is left to [`Response::next_piece`].
    async fn read_response(mut self) -> Result<Response, Unanswered> {
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

    /// The next piece of the body as a range of the buffer; `None` at its end.
    async fn next_piece(&mut self, body: &mut Body) -> Result<Option<Range<usize>>, HttpError> {
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

    async fn read_or_fail(&mut self, when: &'static str) -> Result<(), HttpError> {
        if self.read_more().await? {
            Ok(())
        } else {
            Err(HttpError::Closed(when))
        }
    }

    /// Whether an idle connection can carry another request: the server has
    /// not closed it and sent nothing unasked (checked without waiting).
    fn is_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut probe),
            Poll::Pending
        )
    }
}

/// A response head, as far as the client uses it.
struct Head {
    status: u16,
    retry_after: Option<Duration>,
    body: Body,
    keep_alive: bool,
}

/// The [`Instant`] of a wall-clock time in the recent past (`now` is the
/// instant of the present).
fn instant_of(time: SystemTime, now: Instant) -> Instant {
    match SystemTime::now().duration_since(time) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        Err(_) => now, // in the future: the clock stepped back
    }
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
fn retry_after(headers: &[httparse::Header<'_>]) -> Option<Duration> {
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

/// A response whose head was read; its body is read piece by piece.
pub struct Response {
    pub status: u16,
    /// `Retry-After` of a 429 or 503.
    pub retry_after: Option<Duration>,
    /// The request was sent again on a new connection (see [`Target::send`]).
    pub resent: bool,
    body: Body,
    keep_alive: bool,
    connection: Connection,
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
    fn reusable(&self) -> bool {
        self.body == Body::Done && self.keep_alive && self.connection.start == self.connection.end
    }

    /// Returns the connection to `target`'s pool when the body was read to
    /// the end and the server keeps the connection open; closes it otherwise.
    pub fn finish(self, target: &Target) {
        if self.reusable() {
            let mut connection = self.connection;
            connection.idle_since = Instant::now();
            lock(&target.idle).push(connection);
        }
    }
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// TLS with the platform's certificate verifier, trusting `extra_roots` as
/// well, offering only HTTP/1.1.
fn tls_connector(
    extra_roots: &[CertificateDer<'static>],
) -> Result<tokio_rustls::TlsConnector, String> {
    // Install ring's provider (a second call finds one installed and changes nothing).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = rustls::ClientConfig::builder();
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra_roots.iter().cloned(),
        builder.crypto_provider().clone(),
    )
    .map_err(|e| format!("cannot load the system's TLS certificates: {e}"))?;
    // "dangerous" is rustls's name for any verifier but its own: this one is
    // the platform's, which `with_platform_verifier` installs the same way.
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The CA certificates of a PEM file, checked to be usable as trust anchors.
pub fn read_ca_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no certificate: expected PEM blocks starting with -----BEGIN CERTIFICATE-----",
            path.display()
        ));
    }
    let (_, unusable) = rustls::RootCertStore::empty().add_parsable_certificates(certs.clone());
    if unusable > 0 {
        return Err(format!(
            "{}: {unusable} of its {} certificates cannot be parsed as a CA certificate",
            path.display(),
            certs.len()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(base: &str) -> Result<Target, String> {
        Target::new(base, Duration::from_secs(1), &[], &Proxies::default())
    }

    #[test]
    fn parses_base_urls() {
        let t = target("http://127.0.0.1:8000/v1/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("127.0.0.1", 8000, "/v1")
        );
        assert_eq!(t.url("models"), "http://127.0.0.1:8000/v1/models");
        assert_eq!(t.url("/tokenize"), "http://127.0.0.1:8000/tokenize");
        let head = t
            .template("POST", "chat/completions", &HeaderMap::new())
            .with_body(b"{}");
        assert_eq!(
            head,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-length: 2\r\n\r\n{}"
        );

        let t = target("http://[::1]/openai/v1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.authority.as_str()),
            ("::1", 80, "[::1]")
        );
        assert_eq!(t.url("models"), "http://[::1]/openai/v1/models");
        assert_eq!(
            target("http://localhost:9000").unwrap().path("models"),
            "/models"
        );
    }

    #[test]
    fn refuses_bad_base_urls_with_the_fix() {
        for (base, expected) in [
            ("localhost:8000/v1", "no scheme"),
            ("ftp://host/v1", "unsupported scheme"),
            ("http://user:pw@host/v1", "--api-key"),
            ("http://host/v1?x=1", "query string"),
            ("http://ho st/v1", "not a URL"),
        ] {
            let err = target(base).unwrap_err();
            assert!(err.contains(expected), "{base}: {err}");
        }
    }

    /// A server side that answers each read with the next of `reads` (then
    /// end of stream), and accepts any write.
    struct Scripted {
        reads: std::collections::VecDeque<Vec<u8>>,
        started: bool,
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if std::mem::replace(&mut self.started, true) {
                // Every read after the first returns at a later instant.
                std::thread::sleep(Duration::from_micros(50));
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

    fn scripted(reads: Vec<Vec<u8>>) -> Connection {
        Connection::new(Box::new(Scripted {
            reads: reads.into(),
            started: false,
        }))
    }

    /// Reads a whole response from `reads`: status, body, reusable.
    async fn read(reads: Vec<Vec<u8>>) -> Result<(u16, Vec<u8>, bool), HttpError> {
        let mut response = scripted(reads)
            .read_response()
            .await
            .map_err(Unanswered::into_error)?;
        let (body, total) = response.collect(usize::MAX).await?;
        assert_eq!(body.len(), total);
        Ok((response.status, body, response.reusable()))
    }

    fn one(text: &str) -> Vec<Vec<u8>> {
        vec![text.as_bytes().to_vec()]
    }

    /// `text` split into pieces of `size` bytes.
    fn split(text: &str, size: usize) -> Vec<Vec<u8>> {
        text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect()
    }

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

    /// A real server on 127.0.0.1 that answers `answers` requests per
    /// connection with a keep-alive `ok`, then closes; counts connections.
    async fn keep_alive_server(answers: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    for _ in 0..answers {
                        if !matches!(answer_ok(&mut socket).await, Ok(true)) {
                            return;
                        }
                    }
                });
            }
        });
        (base, accepted)
    }

    /// Reads one request head (no body in these tests) and answers it with
    /// a keep-alive `ok`; `Ok(false)` when the client closed first.
    async fn answer_ok(io: &mut (impl AsyncRead + AsyncWrite + Unpin)) -> std::io::Result<bool> {
        let mut request = Vec::new();
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut piece = [0u8; 1024];
            match io.read(&mut piece).await? {
                0 => return Ok(false),
                n => request.extend_from_slice(&piece[..n]),
            }
        }
        io.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await?;
        Ok(true)
    }

    async fn get(t: &Target) -> Result<Vec<u8>, HttpError> {
        let request = t
            .template("GET", "models", &HeaderMap::new())
            .with_body(b"");
        let mut response = t.send(&request).await?;
        let (body, _) = response.collect(1024).await?;
        response.finish(t);
        Ok(body)
    }

    #[tokio::test]
    async fn connections_are_reused_and_closed_ones_replaced() {
        let (base, accepted) = keep_alive_server(usize::MAX).await;
        let t = target(&base).unwrap();
        for _ in 0..5 {
            assert_eq!(get(&t).await.unwrap(), b"ok");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);

        // A server that closes after each answer: the closed idle connection
        // is noticed before it is used, and a new one carries the request.
        let (base, accepted) = keep_alive_server(1).await;
        let t = target(&base).unwrap();
        for _ in 0..3 {
            assert_eq!(get(&t).await.unwrap(), b"ok");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// A TLS server on 127.0.0.1 presenting `chain`, for one connection:
    /// it answers one request with "ok", or ends with the handshake's error.
    async fn tls_server(
        chain: Vec<CertificateDer<'static>>,
        key: &rcgen::KeyPair,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        // Builds where rustls has two crypto providers need one chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(socket).await?;
            if answer_ok(&mut tls).await? {
                tls.shutdown().await?;
            }
            Ok(())
        });
        (address, server)
    }

    /// A private CA and a certificate for `name` it signed.
    fn private_ca(
        name: &str,
    ) -> (
        rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        rcgen::Certificate,
        rcgen::KeyPair,
    ) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "nyann-bench test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut leaf = CertificateParams::new(vec![name.to_string()]).unwrap();
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = leaf.signed_by(&leaf_key, &ca).unwrap();
        (ca, leaf, leaf_key)
    }

    /// https goes through TLS and checks the server's certificate: a
    /// self-signed one is refused with the reason.
    #[tokio::test]
    async fn https_refuses_an_untrusted_certificate() {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let (address, server) = tls_server(vec![key.cert.der().clone()], &key.signing_key).await;
        let t = target(&format!("https://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "cannot connect to {address}: TLS handshake failed: "
            )),
            "{err}"
        );
        assert!(err.contains("certificate"), "{err}");
        // The server saw the client give up during the handshake.
        assert!(server.await.unwrap().is_err());
    }

    /// A server certificate from a private CA is refused by default and
    /// accepted once the CA is given as an extra root (`--ca-cert`).
    #[tokio::test]
    async fn https_trusts_a_private_ca_given_as_extra_root() {
        let (ca, leaf, leaf_key) = private_ca("127.0.0.1");
        let chain = vec![leaf.der().clone(), ca.der().clone()];

        let (address, server) = tls_server(chain.clone(), &leaf_key).await;
        let t = target(&format!("https://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(err.contains("TLS handshake failed"), "{err}");
        assert!(server.await.unwrap().is_err());

        let (address, server) = tls_server(chain, &leaf_key).await;
        let base = format!("https://{address}/v1");
        let t = Target::new(
            &base,
            Duration::from_secs(1),
            &[ca.der().clone()],
            &Proxies::default(),
        )
        .unwrap();
        assert_eq!(get(&t).await.unwrap(), b"ok");
        server.await.unwrap().unwrap();
    }

    #[test]
    fn ca_files_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf, _) = private_ca("127.0.0.1");
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(
            &bundle,
            format!("# private CAs\n{}{}", ca.pem(), leaf.pem()),
        )
        .unwrap();
        assert_eq!(
            read_ca_certs(&bundle).unwrap(),
            vec![ca.der().clone(), leaf.der().clone()]
        );

        let missing = dir.path().join("missing.pem");
        let err = read_ca_certs(&missing).unwrap_err();
        assert!(
            err.starts_with(&format!("cannot read {}: ", missing.display())),
            "{err}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = read_ca_certs(&empty).unwrap_err();
        assert!(err.contains("holds no certificate"), "{err}");

        let broken = dir.path().join("broken.pem");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        std::fs::write(&broken, format!("{}{garbage}", ca.pem())).unwrap();
        let err = read_ca_certs(&broken).unwrap_err();
        assert!(
            err.ends_with("1 of its 2 certificates cannot be parsed as a CA certificate"),
            "{err}"
        );
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

    /// What a scripted server does with one request on a connection.
    #[derive(Clone, Copy, Debug)]
    enum Act {
        /// Answer `ok`, keeping the connection open.
        Answer,
        /// Read the request, then close without a byte back (a keep-alive
        /// timeout that raced the request).
        CloseSilently,
        /// Read the request, send half a head, close.
        HalfAnswer,
    }

    /// A server on 127.0.0.1 whose n-th connection follows `scripts[n]`, one
    /// act per request; returns its base URL and how many connections it took.
    async fn scripted_server(
        scripts: Vec<Vec<Act>>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            for script in scripts {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    for act in script {
                        let done = match act {
                            Act::Answer => !matches!(answer_ok(&mut socket).await, Ok(true)),
                            Act::CloseSilently | Act::HalfAnswer => {
                                let _ = read_head(&mut socket).await;
                                if let Act::HalfAnswer = act {
                                    let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nConte").await;
                                }
                                true
                            }
                        };
                        if done {
                            return;
                        }
                    }
                });
            }
        });
        (base, accepted)
    }

    async fn read_head(io: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
        let mut request = Vec::new();
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut piece = [0u8; 1024];
            match io.read(&mut piece).await? {
                0 => break,
                n => request.extend_from_slice(&piece[..n]),
            }
        }
        Ok(request)
    }

    async fn get_response(t: &Target) -> Result<(Vec<u8>, bool), HttpError> {
        let request = t
            .template("GET", "models", &HeaderMap::new())
            .with_body(b"");
        let mut response = t.send(&request).await?;
        let resent = response.resent;
        let (body, _) = response.collect(1024).await?;
        response.finish(t);
        Ok((body, resent))
    }

    /// A pooled connection the server closed without a byte back: the
    /// request goes once more on a new connection, and says so.
    #[tokio::test]
    async fn a_request_into_a_closed_kept_alive_connection_is_sent_again_once() {
        use Act::*;
        let (base, accepted) =
            scripted_server(vec![vec![Answer, CloseSilently], vec![Answer]]).await;
        let t = target(&base).unwrap();
        assert_eq!(get_response(&t).await.unwrap(), (b"ok".to_vec(), false));
        assert_eq!(get_response(&t).await.unwrap(), (b"ok".to_vec(), true));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);

        // Not when the server answered part of a head...
        let (base, accepted) = scripted_server(vec![vec![Answer, HalfAnswer], vec![Answer]]).await;
        let t = target(&base).unwrap();
        get_response(&t).await.unwrap();
        let err = get_response(&t).await.unwrap_err().to_string();
        assert!(err.contains("in the middle of the response head"), "{err}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);

        // ...nor on a new connection, and only once.
        let (base, accepted) = scripted_server(vec![
            vec![CloseSilently],
            vec![Answer, CloseSilently],
            vec![CloseSilently],
        ])
        .await;
        let t = target(&base).unwrap();
        let err = get_response(&t).await.unwrap_err();
        assert!(!matches!(err, HttpError::Resent(_)), "{err}");
        get_response(&t).await.unwrap();
        let err = get_response(&t).await.unwrap_err().to_string();
        assert!(
            err.contains("before answering") && err.contains("sent again on a new connection"),
            "{err}"
        );
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// An http target behind a proxy: requests go to the proxy in absolute
    /// form, with the proxy's credentials; loopback never goes through it.
    #[tokio::test]
    async fn http_goes_through_the_proxy_in_absolute_form() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        let seen = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let head = read_head(&mut socket).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(head).unwrap()
        });
        let proxies = Proxies::parse(Some(format!("http://u:p@{proxy}")), None, None).unwrap();
        let via = |base| Target::new(base, Duration::from_secs(1), &[], &proxies).unwrap();
        let t = via("http://model.test:8000/v1");
        assert_eq!(get(&t).await.unwrap(), b"ok");
        let head = seen.await.unwrap();
        assert!(
            head.starts_with("GET http://model.test:8000/v1/models HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("host: model.test:8000\r\n"), "{head}");
        assert!(
            head.contains("proxy-authorization: Basic dTpw\r\n"),
            "{head}"
        );
        assert!(via("http://127.0.0.1:8000/v1").proxy.is_none());
    }

    /// An https target behind a proxy: a CONNECT tunnel, TLS inside it with
    /// the target's name; a refused CONNECT says so.
    #[tokio::test]
    async fn https_goes_through_a_connect_tunnel() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ca, leaf, leaf_key) = private_ca("model.test");
        let private = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], private)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            // First connection: a tunnel to a TLS server; second: refused.
            let (mut socket, _) = listener.accept().await.unwrap();
            let connect = String::from_utf8(read_head(&mut socket).await.unwrap()).unwrap();
            socket
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .unwrap();
            let mut tls = acceptor.accept(socket).await.unwrap();
            assert!(answer_ok(&mut tls).await.unwrap());
            let (mut socket, _) = listener.accept().await.unwrap();
            read_head(&mut socket).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                .await
                .unwrap();
            connect
        });
        let proxies = Proxies::parse(None, Some(proxy.to_string()), None).unwrap();
        let roots = [ca.der().clone()];
        let t = Target::new(
            "https://model.test/v1",
            Duration::from_secs(2),
            &roots,
            &proxies,
        )
        .unwrap();
        assert_eq!(get(&t).await.unwrap(), b"ok");
        let t = Target::new(
            "https://model.test/v1",
            Duration::from_secs(2),
            &roots,
            &proxies,
        )
        .unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(
            err.contains(&format!("proxy {proxy} (for model.test:443)"))
                && err.contains("the proxy refused CONNECT model.test:443: HTTP 407"),
            "{err}"
        );
        let connect = server.await.unwrap();
        assert!(
            connect.starts_with("CONNECT model.test:443 HTTP/1.1\r\nhost: model.test:443\r\n"),
            "{connect}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_clients_own_failures_are_told_apart() {
        let connect = |code| HttpError::Connect {
            address: "a".into(),
            reason: "r".into(),
            client_side: is_client_side(&std::io::Error::from_raw_os_error(code)),
        };
        let (emfile, refused) = (nix::errno::Errno::EMFILE, nix::errno::Errno::ECONNREFUSED);
        assert!(connect(emfile as i32).is_client_side());
        assert!(HttpError::Resent(Box::new(connect(emfile as i32))).is_client_side());
        assert!(!connect(refused as i32).is_client_side());
        assert!(!HttpError::Closed("before answering").is_client_side());
    }

    #[tokio::test]
    async fn refused_connections_name_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let t = target(&format!("http://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot connect to {address}: ")),
            "{err}"
        );
    }
}
