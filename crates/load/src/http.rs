//! The HTTP/1.1 transport under the client: one target server (origin and
//! base path), its pool of idle keep-alive connections, and connecting (TCP
//! with `TCP_NODELAY`, TLS for `https`).
//!
//! Built on hyper's connection-level API rather than a general-purpose
//! client (no redirects, proxies or retry layers to pay for on every
//! request): a connection carries one request at a time and goes back to the
//! pool only after its response was read to the end, so a run never holds
//! more connections than it had requests in flight.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::client::error_chain;

/// A request body: always sent whole.
pub type Body = Full<Bytes>;

/// An idle, reusable connection.
pub type Connection = SendRequest<Body>;

/// The server one base URL (`http://host:port/v1`) points at.
#[derive(Debug)]
pub struct Target {
    /// The base URL as given, without a trailing slash (for messages).
    pub base: String,
    host: String,
    port: u16,
    /// The `Host` header.
    authority: HeaderValue,
    /// The base URL's path without a trailing slash (`/v1`).
    prefix: String,
    /// Present for `https`.
    tls: Option<Tls>,
    connect_timeout: Duration,
    /// Idle connections, most recently used last (reused first: it is the
    /// least likely to have been closed by the server's keep-alive timeout).
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

impl Target {
    /// Parses a base URL such as `http://127.0.0.1:8000/v1`.
    pub fn new(base: &str, connect_timeout: Duration) -> Result<Self, String> {
        let base = base.trim_end_matches('/');
        if !base.contains("://") {
            return Err("no scheme: write it as http://host:port/v1".into());
        }
        let uri: Uri = base.parse().map_err(|e| format!("not a URL: {e}"))?;
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
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        // IPv6 literals come bracketed (`[::1]`): the Host header keeps the
        // brackets, the socket address does not.
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = if https {
            Some(Tls {
                connector: tls_connector()?,
                server_name: rustls::pki_types::ServerName::try_from(bare_host.clone())
                    .map_err(|e| format!("invalid TLS server name {bare_host:?}: {e}"))?,
            })
        } else {
            None
        };
        Ok(Target {
            base: base.to_string(),
            host: bare_host,
            port,
            authority: HeaderValue::from_str(authority.as_str())
                .map_err(|e| format!("invalid host: {e}"))?,
            prefix: uri.path().trim_end_matches('/').to_string(),
            tls,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The origin-form URI of `path` below the base URL (`chat/completions`
    /// -> `/v1/chat/completions`), or at the server's root when `path`
    /// starts with `/`.
    pub fn uri(&self, path: &str) -> Result<Uri, String> {
        let full = match path.strip_prefix('/') {
            Some(_) => path.to_string(),
            None => format!("{}/{path}", self.prefix),
        };
        full.parse()
            .map_err(|e| format!("invalid request path {full:?}: {e}"))
    }

    /// The URL of `path` as [`Target::uri`] resolves it, for messages.
    pub fn url(&self, path: &str) -> String {
        let root = self.base.strip_suffix(&self.prefix).unwrap_or(&self.base);
        match path.strip_prefix('/') {
            Some(_) => format!("{root}{path}"),
            None => format!("{}/{path}", self.base),
        }
    }

    /// A request to `uri` with the `Host` header and `headers` set.
    pub fn request(
        &self,
        method: Method,
        uri: Uri,
        headers: &HeaderMap,
        body: Body,
    ) -> Request<Body> {
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        let map = request.headers_mut();
        map.reserve(headers.len() + 1);
        map.insert(header::HOST, self.authority.clone());
        for (name, value) in headers {
            map.append(name, value.clone());
        }
        request
    }

    /// Sends `request` on an idle connection (or a new one) and returns the
    /// response with its connection; give the connection back with
    /// [`Target::release`] once the body was read to the end.
    pub async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<(Response<Incoming>, Connection), String> {
        while let Some(mut connection) = self.take_idle() {
            if connection.ready().await.is_err() {
                continue; // closed while idle
            }
            match connection.try_send_request(request).await {
                Ok(response) => return Ok((response, connection)),
                // Handed back unsent (the connection closed as it was
                // taken): this is not a retry, the server never saw it.
                Err(mut err) => match err.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(error_chain(&err.into_error())),
                },
            }
        }
        let mut connection = self.connect().await?;
        match connection.send_request(request).await {
            Ok(response) => Ok((response, connection)),
            Err(err) => Err(error_chain(&err)),
        }
    }

    /// Returns a connection whose response was read to the end to the pool.
    pub fn release(&self, connection: Connection) {
        if !connection.is_closed() {
            lock(&self.idle).push(connection);
        }
    }

    fn take_idle(&self) -> Option<Connection> {
        lock(&self.idle).pop()
    }

    async fn connect(&self) -> Result<Connection, String> {
        let address = format!("{}:{}", self.host, self.port);
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| {
            format!(
                "cannot connect to {address}: timed out after {:?}",
                self.connect_timeout
            )
        })?
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        // Without it, Nagle's algorithm and the server's delayed ACK add tens
        // of milliseconds to small requests.
        tcp.set_nodelay(true)
            .map_err(|e| format!("cannot set TCP_NODELAY on the connection to {address}: {e}"))?;
        match &self.tls {
            None => handshake(tcp).await,
            Some(tls) => {
                let stream = tokio::time::timeout(
                    self.connect_timeout,
                    tls.connector.connect(tls.server_name.clone(), tcp),
                )
                .await
                .map_err(|_| {
                    format!(
                        "TLS handshake with {address} timed out after {:?}",
                        self.connect_timeout
                    )
                })?
                .map_err(|e| format!("TLS handshake with {address} failed: {}", error_chain(&e)))?;
                handshake(stream).await
            }
        }
    }
}

/// Starts HTTP/1.1 on `io`; the connection's I/O runs in its own task until
/// its last [`Connection`] handle is dropped or the server closes it.
async fn handshake<T>(io: T) -> Result<Connection, String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake failed: {}", error_chain(&e)))?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!("connection closed: {}", error_chain(&err));
        }
    });
    Ok(sender)
}

/// TLS with the platform's certificate verifier, offering only HTTP/1.1.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    use rustls_platform_verifier::BuilderVerifierExt;
    // Install ring's provider (a second call finds one installed and changes nothing).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = rustls::ClientConfig::builder()
        .with_platform_verifier()
        .map_err(|e| format!("cannot load the system's TLS certificates: {e}"))?
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(base: &str) -> Result<Target, String> {
        Target::new(base, Duration::from_secs(1))
    }

    #[test]
    fn parses_base_urls() {
        let t = target("http://127.0.0.1:8000/v1/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("127.0.0.1", 8000, "/v1")
        );
        assert_eq!(t.authority, "127.0.0.1:8000");
        assert_eq!(t.uri("chat/completions").unwrap(), "/v1/chat/completions");
        assert_eq!(t.uri("/tokenize").unwrap(), "/tokenize");
        assert_eq!(t.url("models"), "http://127.0.0.1:8000/v1/models");
        assert_eq!(t.url("/tokenize"), "http://127.0.0.1:8000/tokenize");

        let t = target("http://[::1]/openai/v1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("::1", 80, "/openai/v1")
        );
        assert_eq!(t.authority, "[::1]");

        let t = target("http://localhost:9000").unwrap();
        assert_eq!(t.uri("models").unwrap(), "/models");
    }

    #[test]
    fn refuses_bad_base_urls_with_the_fix() {
        for (base, expected) in [
            ("localhost:8000/v1", "scheme"),
            ("ftp://host/v1", "unsupported scheme"),
            ("http://user:pw@host/v1", "--api-key"),
            ("http://host/v1?x=1", "query string"),
            ("not a url", "scheme"),
            ("http://ho st/v1", "not a URL"),
        ] {
            let err = target(base).unwrap_err();
            assert!(err.contains(expected), "{base}: {err}");
        }
    }
}
