//! Opening a new connection: TCP (with `TCP_NODELAY`) to the target or its
//! proxy, a `CONNECT` tunnel through the proxy for `https`, then the TLS
//! handshake; each step bounded by the connect timeout.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::arrival::ArrivalStream;
use super::connection::{Connection, Io};
use super::error::is_client_side;
use super::{HttpError, MAX_BUFFER, MAX_HEADERS, Proxy, Target};

impl Target {
    pub(super) async fn connect(&self) -> Result<Connection, HttpError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Proxies;
    use crate::http::test_support::*;
    use std::sync::Arc;
    use std::time::Duration;

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
        let target = || {
            Target::new(
                "https://model.test/v1",
                Duration::from_secs(2),
                &roots,
                &proxies,
            )
            .unwrap()
        };
        assert_eq!(get(&target()).await.unwrap(), b"ok");
        let err = get(&target()).await.unwrap_err().to_string();
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
