//! A TCP tap in front of an HTTP/1.1 server: it forwards every byte both
//! ways and keeps them, so that a test reads the exact requests a client
//! sent and the responses it got (the bodies too) without the server
//! having to record anything. Requests of one connection are answered in
//! order (no pipelining), so the k-th request of a connection pairs with
//! its k-th response.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bytes of one connection, each way.
#[derive(Debug, Default)]
struct Connection {
    to_server: Vec<u8>,
    to_client: Vec<u8>,
}

/// A running tap on an ephemeral loopback port.
pub struct Tap {
    addr: SocketAddr,
    connections: Arc<Mutex<Vec<Arc<Mutex<Connection>>>>>,
    accept: tokio::task::JoinHandle<()>,
}

/// One request and its response.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    /// As sent: `/v1/chat/completions`.
    pub path: String,
    pub request: Vec<u8>,
    /// `None`: no complete response head came back.
    pub status: Option<u16>,
    /// The response body (chunked transfer decoded); as much as came.
    pub response: Vec<u8>,
}

impl Exchange {
    /// The request body as JSON (`Null` when it is not).
    pub fn request_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.request).unwrap_or_default()
    }

    /// The response's server-sent events: the `data:` payloads that are
    /// JSON, in order (`[DONE]` left out).
    pub fn events(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.response)
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect()
    }

    /// The text a streamed completion carried (chat deltas' `content`, or
    /// completions' `text`).
    pub fn streamed_text(&self) -> String {
        self.events()
            .iter()
            .filter_map(|event| {
                let choice = &event["choices"][0];
                choice["delta"]["content"]
                    .as_str()
                    .or(choice["text"].as_str())
                    .map(str::to_owned)
            })
            .collect()
    }

    /// The response's `id` (the first event's).
    pub fn response_id(&self) -> Option<String> {
        self.events()
            .iter()
            .find_map(|event| event["id"].as_str().map(str::to_owned))
    }
}

impl Tap {
    /// Forwards connections to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<Mutex<Vec<Arc<Mutex<Connection>>>>> = Arc::default();
        let all = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let connection = Arc::new(Mutex::new(Connection::default()));
                all.lock().unwrap().push(connection.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let up = connection.clone();
                tokio::spawn(forward(client_read, server_write, move |bytes| {
                    up.lock().unwrap().to_server.extend_from_slice(bytes);
                }));
                tokio::spawn(forward(server_read, client_write, move |bytes| {
                    connection
                        .lock()
                        .unwrap()
                        .to_client
                        .extend_from_slice(bytes);
                }));
            }
        });
        Tap {
            addr,
            connections,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`: the OpenAI base URL through the tap.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every exchange so far, connection by connection, each in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let connections = self.connections.lock().unwrap().clone();
        let mut out = Vec::new();
        for connection in connections {
            let connection = connection.lock().unwrap();
            let requests = requests(&connection.to_server);
            let mut responses = responses(&connection.to_client).into_iter();
            for (method, path, request) in requests {
                let (status, response) = responses.next().unwrap_or((None, Vec::new()));
                out.push(Exchange {
                    method,
                    path,
                    request,
                    status,
                    response,
                });
            }
        }
        out
    }

    /// The exchanges whose path ends with `suffix` (`chat/completions`).
    pub fn exchanges_to(&self, suffix: &str) -> Vec<Exchange> {
        self.exchanges()
            .into_iter()
            .filter(|e| e.path.ends_with(suffix))
            .collect()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, showing every piece to `keep`, until either end closes.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    keep: impl Fn(&[u8]),
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                keep(&buf[..n]);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Header names (lower case) and values.
type Headers = Vec<(String, String)>;

/// A message head: its first line and headers, and where its body starts.
fn head(bytes: &[u8]) -> Option<(String, Headers, usize)> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&bytes[..end - 4]).into_owned();
    let mut lines = text.split("\r\n");
    let first = lines.next()?.to_string();
    let headers = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_string()))
        })
        .collect();
    Some((first, headers, end))
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The requests in a client's bytes: method, path and body (bodies by
/// `content-length`, the way the client under test sends them).
fn requests(mut bytes: &[u8]) -> Vec<(String, String, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((first, headers, start)) = head(bytes) {
        let length = header(&headers, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let end = (start + length).min(bytes.len());
        let mut parts = first.split(' ');
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        out.push((method, path, bytes[start..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

/// The responses in a server's bytes: status and body (by
/// `content-length`, chunked, or to the end of the connection).
fn responses(mut bytes: &[u8]) -> Vec<(Option<u16>, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((first, headers, start)) = head(bytes) {
        let status = first.split(' ').nth(1).and_then(|s| s.parse().ok());
        let rest = &bytes[start..];
        let chunked = header(&headers, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let (body, used) = if chunked {
            dechunk(rest)
        } else if let Some(length) =
            header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok())
        {
            let length = length.min(rest.len());
            (rest[..length].to_vec(), length)
        } else {
            (rest.to_vec(), rest.len())
        };
        out.push((status, body));
        bytes = &rest[used..];
    }
    out
}

/// A chunked body's bytes, and how many bytes it took (all that came, when
/// it was cut).
fn dechunk(bytes: &[u8]) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_end) = bytes[at..].windows(2).position(|w| w == b"\r\n") else {
            return (body, bytes.len());
        };
        let size_text = String::from_utf8_lossy(&bytes[at..at + line_end]).into_owned();
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return (body, bytes.len());
        };
        at += line_end + 2;
        if size == 0 {
            // Trailers, then the blank line.
            let end = bytes[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .map_or(bytes.len(), |p| at + p + 2);
            return (body, end);
        }
        let end = (at + size).min(bytes.len());
        body.extend_from_slice(&bytes[at..end]);
        at = (end + 2).min(bytes.len());
        if end == bytes.len() {
            return (body, bytes.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_are_read_back() {
        let client = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"a\":1}GET /v1/models HTTP/1.1\r\n\r\n";
        let reqs = requests(client);
        assert_eq!(reqs.len(), 2);
        assert_eq!(
            (reqs[0].0.as_str(), reqs[0].1.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(reqs[0].2, b"{\"a\":1}");
        assert_eq!((reqs[1].0.as_str(), reqs[1].2.len()), ("GET", 0));
        let server = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\nHTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnopeHTTP/1.1 200 OK\r\n\r\nto the end";
        let resps = responses(server);
        assert_eq!(
            resps,
            [
                (Some(200), b"hello world".to_vec()),
                (Some(404), b"nope".to_vec()),
                (Some(200), b"to the end".to_vec()),
            ]
        );
    }

    #[test]
    fn a_streamed_completion_gives_its_text_and_id() {
        let exchange = Exchange {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            request: b"{\"max_tokens\": 3}".to_vec(),
            status: Some(200),
            response: b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\" sky\"}}]}\n\ndata: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\" sea\"}}]}\n\ndata: [DONE]\n\n".to_vec(),
        };
        assert_eq!(exchange.request_json()["max_tokens"], 3);
        assert_eq!(exchange.streamed_text(), " sky sea");
        assert_eq!(exchange.response_id().as_deref(), Some("chatcmpl-1"));
    }
}
