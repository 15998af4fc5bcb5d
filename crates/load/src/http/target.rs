//! The server a base URL (`http://host:port/v1`) points at: the URL
//! checked and taken apart, the paths below it, and the request heads
//! written for it once per endpoint ([`RequestTemplate`]).

use std::sync::Mutex;
use std::time::Duration;

use http::header::HeaderMap;
use rustls::pki_types::CertificateDer;

use super::connection::Connection;
use super::tls::{Tls, tls_connector};
use super::{Proxies, Proxy};

/// Why a base URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The caller says how to send credentials instead.
    #[error("user names and passwords in the URL are not supported")]
    Credentials,
    #[error("{0}")]
    Invalid(String),
}

impl From<String> for TargetError {
    fn from(reason: String) -> Self {
        TargetError::Invalid(reason)
    }
}

impl From<&str> for TargetError {
    fn from(reason: &str) -> Self {
        TargetError::Invalid(reason.to_string())
    }
}

/// The server one base URL (`http://host:port/v1`) points at.
#[derive(Debug)]
pub struct Target {
    /// The base URL as given, without a trailing slash (for messages).
    pub base: String,
    pub(super) host: String,
    pub(super) port: u16,
    /// The `Host` header.
    pub(super) authority: String,
    /// The base URL's path without a trailing slash (`/v1`).
    pub(super) prefix: String,
    /// Present for `https`.
    pub(super) tls: Option<Tls>,
    /// The proxy the target is reached through, if any.
    pub(super) proxy: Option<Proxy>,
    pub(super) connect_timeout: Duration,
    /// Idle connections, most recently used last (reused first).
    pub(super) idle: Mutex<Vec<Connection>>,
}

/// A request rendered up to its `Content-Length`: method, path, `Host` and
/// the fixed headers, written once and copied in front of every body.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    pub(super) head: Vec<u8>,
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
    ) -> Result<Self, TargetError> {
        let base = base.trim_end_matches('/');
        if !base.contains("://") {
            return Err("no scheme: write it as http://host:port/v1".into());
        }
        let uri: http::Uri = base.parse().map_err(|e| format!("not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(format!("unsupported scheme {other:?}: use http or https").into());
            }
            None => return Err("no scheme: write it as http://host:port/v1".into()),
        };
        let authority = uri
            .authority()
            .ok_or("no host: write it as http://host:port/v1")?;
        if authority.as_str().contains('@') {
            return Err(TargetError::Credentials);
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
    pub(super) fn path(&self, path: &str) -> String {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::target;

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
            ("http://user:pw@host/v1", "user names and passwords"),
            ("http://host/v1?x=1", "query string"),
            ("http://ho st/v1", "not a URL"),
        ] {
            let err = target(base).unwrap_err().to_string();
            assert!(err.contains(expected), "{base}: {err}");
        }
    }
}
