//! The leader's address as a worker is given it, and one attempt to reach
//! it. Both `HOST:PORT` and `http://HOST:PORT` (the form every other URL the
//! tool takes) are accepted; anything else, a missing port above all, is
//! refused when parsed, before the worker waits for anything. A failed
//! attempt says why in words a user can act on (the name does not resolve,
//! nothing listens there yet, ...), since a worker may wait minutes.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use tokio::net::TcpStream;

/// A coordinator address: a host name or IP address and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    pub host: String,
    pub port: u16,
}

/// Why an address is not a coordinator address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    #[error("{0:?} has no port: give HOST:PORT, e.g. nyann-bench-0.nyann-bench:7300")]
    MissingPort(String),
    #[error(
        "{0:?}: the coordination protocol is plain TCP: give HOST:PORT or http://HOST:PORT, not another scheme"
    )]
    Scheme(String),
    #[error("{0:?}: the coordinator is an address, HOST:PORT, without a path")]
    Path(String),
    #[error("{0:?}: the port is not a number from 1 to 65535")]
    Port(String),
    #[error("{0:?}: the host is missing: give HOST:PORT")]
    Host(String),
}

impl FromStr for Coordinator {
    type Err = CoordinatorError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let s = given.trim();
        let rest = match s.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some(_) => return Err(CoordinatorError::Scheme(given.into())),
            None => s,
        };
        // A trailing slash is what a URL often ends with; a path is not.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('#') {
            return Err(CoordinatorError::Path(given.into()));
        }
        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            // [IPv6]:PORT
            let Some((host, after)) = bracketed.split_once(']') else {
                return Err(CoordinatorError::Host(given.into()));
            };
            let Some(port) = after.strip_prefix(':') else {
                return Err(CoordinatorError::MissingPort(given.into()));
            };
            (host, port)
        } else {
            match rest.rsplit_once(':') {
                Some((host, _)) if host.contains(':') => {
                    // A bare IPv6 address: its last group is no port.
                    return Err(CoordinatorError::MissingPort(given.into()));
                }
                Some((host, port)) => (host, port),
                None => return Err(CoordinatorError::MissingPort(given.into())),
            }
        };
        if host.is_empty() {
            return Err(CoordinatorError::Host(given.into()));
        }
        if port.is_empty() {
            return Err(CoordinatorError::MissingPort(given.into()));
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(CoordinatorError::Port(given.into())),
        };
        Ok(Coordinator {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How long one connection attempt to one address may take (a dropped
/// SYN would otherwise take the kernel's minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Coordinator {
    /// One attempt: resolve the name, connect to its addresses in turn.
    /// The error says why the last address failed.
    pub async fn connect(&self) -> Result<TcpStream, String> {
        let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
        {
            Ok(addrs) => addrs.collect(),
            Err(err) => {
                return Err(format!(
                    "the name {} does not resolve ({err}): the leader's pod may not exist yet, or the name is wrong",
                    self.host
                ));
            }
        };
        let mut last = format!("the name {} resolves to no address", self.host);
        for addr in addrs {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                    last = format!(
                        "{addr}: connection refused (nothing listens there yet: is worker 0 started, with this port?)"
                    );
                }
                Ok(Err(err)) => last = format!("{addr}: {err}"),
                Err(_) => {
                    last = format!("{addr}: no answer to the connection within {CONNECT_TIMEOUT:?}")
                }
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(s: &str) -> Result<Coordinator, CoordinatorError> {
        s.parse()
    }

    #[test]
    fn host_port_and_http_urls_are_accepted() {
        let expected = Coordinator {
            host: "bench-0.bench".into(),
            port: 7300,
        };
        for given in [
            "bench-0.bench:7300",
            "http://bench-0.bench:7300",
            "HTTP://bench-0.bench:7300/",
            " bench-0.bench:7300 ",
        ] {
            assert_eq!(parse(given).unwrap(), expected, "{given}");
        }
        let v6 = parse("http://[::1]:7300").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 7300));
        assert_eq!(v6.to_string(), "[::1]:7300");
        assert_eq!(parse("127.0.0.1:1").unwrap().to_string(), "127.0.0.1:1");
    }

    #[test]
    fn a_missing_port_and_other_forms_are_refused() {
        for given in [
            "bench-0",
            "http://bench-0",
            "bench-0:",
            "http://bench-0/",
            "::1",
        ] {
            assert!(
                matches!(parse(given), Err(CoordinatorError::MissingPort(_))),
                "{given}: {:?}",
                parse(given)
            );
        }
        assert!(matches!(
            parse("https://bench-0:7300"),
            Err(CoordinatorError::Scheme(_))
        ));
        assert!(matches!(
            parse("http://bench-0:7300/v1"),
            Err(CoordinatorError::Path(_))
        ));
        for port in ["0", "65536", "x"] {
            assert!(matches!(
                parse(&format!("bench-0:{port}")),
                Err(CoordinatorError::Port(_))
            ));
        }
        assert!(matches!(parse(":7300"), Err(CoordinatorError::Host(_))));
        let message = parse("bench-0").unwrap_err().to_string();
        assert!(message.contains("has no port"), "{message}");
        assert!(!message.contains("--"), "no flag named: {message}");
    }

    #[tokio::test]
    async fn a_failed_attempt_names_its_cause() {
        let nowhere = parse("nyann-no-such-host.invalid:7300").unwrap();
        let err = nowhere.connect().await.unwrap_err();
        assert!(err.contains("does not resolve"), "{err}");

        // A port nothing listens on: bound, then closed.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let closed = Coordinator {
            host: "127.0.0.1".into(),
            port,
        };
        let err = closed.connect().await.unwrap_err();
        assert!(err.contains("connection refused"), "{err}");
    }
}
