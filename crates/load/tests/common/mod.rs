//! A small hand-written OpenAI-like HTTP server for the load tests: it
//! streams `max_tokens` chunks with a fixed delay, records every request body,
//! tracks requests in flight, and can misbehave on demand (HTTP 500, an error
//! event, a truncated stream). One connection per request (`Connection:
//! close`), so a test controls exactly where a response ends. Also
//! [`records`], which reads a run's `requests.jsonl` back.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub mod scenarios;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Http500,
    ErrorEvent,
    Truncate,
    /// Every completion request is answered with this status and, if set,
    /// a `Retry-After` of so many seconds (a server shedding load: 429, 503).
    Reject {
        status: u16,
        retry_after: Option<u32>,
    },
    /// The first completion request gets its head and one chunk, then
    /// nothing ever again; the others are served normally.
    HangFirst,
    /// A streaming request answered as if it were not one: a whole chat
    /// completion in one `application/json` body (a server or proxy that
    /// ignores `"stream": true`).
    WholeJson,
    /// HTTP 200 with an error object as a JSON body.
    JsonError,
}

#[derive(Debug, Clone)]
pub struct Behaviour {
    pub tokenize_chars_per_token: Option<f64>,
    pub token_delay: Duration,
    pub fault: Fault,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            tokenize_chars_per_token: None,
            token_delay: Duration::from_millis(2),
            fault: Fault::None,
        }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub base: String,
    pub state: Arc<State>,
}

#[derive(Default)]
pub struct State {
    pub behaviour: Mutex<Behaviour>,
    /// Bodies of completion requests, in arrival order.
    pub requests: Mutex<Vec<serde_json::Value>>,
    /// Heads (request line and headers) of completion requests, in arrival order.
    pub heads: Mutex<Vec<String>>,
    pub in_flight: AtomicU64,
    /// Completion requests received so far.
    pub received: AtomicU64,
    pub max_in_flight: AtomicU64,
    pub completed: AtomicU64,
    pub tokenize_calls: AtomicU64,
    pub stopped: AtomicBool,
}

impl TestServer {
    pub async fn start(behaviour: Behaviour) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            behaviour: Mutex::new(behaviour),
            ..State::default()
        });
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = handle(conn, st).await;
                });
            }
        });
        TestServer {
            addr,
            base: format!("http://{addr}/v1"),
            state,
        }
    }

    pub fn requests(&self) -> Vec<serde_json::Value> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn heads(&self) -> Vec<String> {
        self.state.heads.lock().unwrap().clone()
    }

    pub fn set_fault(&self, fault: Fault) {
        self.state.behaviour.lock().unwrap().fault = fault;
    }
}

async fn read_request(conn: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let n = conn.read(&mut piece).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&piece[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut piece).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&piece[..n]);
    }
    Ok(Some((head, body)))
}

async fn respond(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(text.as_bytes()).await
}

async fn handle(mut conn: TcpStream, st: Arc<State>) -> std::io::Result<()> {
    let Some((head, body)) = read_request(&mut conn).await? else {
        return Ok(());
    };
    let request_line = head.lines().next().unwrap_or("").to_string();
    let behaviour = st.behaviour.lock().unwrap().clone();
    if request_line.starts_with("GET /v1/models") {
        return respond(
            &mut conn,
            "200 OK",
            "application/json",
            r#"{"object":"list","data":[{"id":"test-model","object":"model"}]}"#,
        )
        .await;
    }
    if request_line.starts_with("POST /tokenize") {
        st.tokenize_calls.fetch_add(1, Ordering::SeqCst);
        let Some(cpt) = behaviour.tokenize_chars_per_token else {
            return respond(
                &mut conn,
                "404 Not Found",
                "application/json",
                r#"{"detail":"Not Found"}"#,
            )
            .await;
        };
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let chars = json["prompt"].as_str().unwrap_or("").len();
        let count = (chars as f64 / cpt).round() as u64;
        return respond(
            &mut conn,
            "200 OK",
            "application/json",
            &format!(r#"{{"count":{count},"max_model_len":4096,"tokens":[]}}"#),
        )
        .await;
    }
    let chat = request_line.starts_with("POST /v1/chat/completions");
    if !chat && !request_line.starts_with("POST /v1/completions") {
        return respond(
            &mut conn,
            "404 Not Found",
            "application/json",
            r#"{"detail":"Not Found"}"#,
        )
        .await;
    }
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let nth = st.received.fetch_add(1, Ordering::SeqCst);
    if let Fault::Reject {
        status,
        retry_after,
    } = behaviour.fault
    {
        st.requests.lock().unwrap().push(json.clone());
        let retry = retry_after
            .map(|s| format!("retry-after: {s}\r\n"))
            .unwrap_or_default();
        let text = format!(
            "HTTP/1.1 {status} Busy\r\n{retry}content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        return conn.write_all(text.as_bytes()).await;
    }
    if behaviour.fault == Fault::HangFirst && nth == 0 {
        st.requests.lock().unwrap().push(json.clone());
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"stuck\"}}]}\n\n")
            .await?;
        // Until the client goes away (the read sees its close).
        let mut rest = [0u8; 64];
        while conn.read(&mut rest).await? > 0 {}
        return Ok(());
    }
    st.requests.lock().unwrap().push(json.clone());
    st.heads.lock().unwrap().push(head.clone());
    let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    st.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let result = stream(&mut conn, &json, chat, &behaviour).await;
    st.in_flight.fetch_sub(1, Ordering::SeqCst);
    st.completed.fetch_add(1, Ordering::SeqCst);
    result
}

async fn stream(
    conn: &mut TcpStream,
    json: &serde_json::Value,
    chat: bool,
    b: &Behaviour,
) -> std::io::Result<()> {
    if b.fault == Fault::WholeJson {
        let body = serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x ".repeat(400)},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 400, "total_tokens": 410},
        });
        return respond(conn, "200 OK", "application/json", &body.to_string()).await;
    }
    if b.fault == Fault::JsonError {
        let body = r#"{"error":{"message":"model not loaded","code":400}}"#;
        return respond(conn, "200 OK", "application/json", body).await;
    }
    if b.fault == Fault::Http500 {
        return respond(
            conn,
            "500 Internal Server Error",
            "application/json",
            r#"{"error":{"message":"engine dead"}}"#,
        )
        .await;
    }
    conn.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
    )
    .await?;
    let n = json["max_tokens"].as_u64().unwrap_or(4);
    // The reply names the turn so multi-turn tests can check replay.
    let messages = json["messages"].as_array().map(|m| m.len()).unwrap_or(0);
    for i in 0..n {
        tokio::time::sleep(b.token_delay).await;
        if b.fault == Fault::Truncate && i == n / 2 {
            conn.write_all(b"data: {\"choices\":[{\"delta\":{\"content\":\"cut")
                .await?;
            return Ok(());
        }
        if b.fault == Fault::ErrorEvent && i == n / 2 {
            conn.write_all(b"data: {\"error\":{\"message\":\"out of memory\",\"code\":500}}\n\n")
                .await?;
            return Ok(());
        }
        let text = format!("m{messages}t{i} ");
        let chunk = if chat {
            serde_json::json!({"choices":[{"index":0,"delta":{"content":text},"finish_reason":serde_json::Value::Null}]})
        } else {
            serde_json::json!({"choices":[{"index":0,"text":text,"finish_reason":serde_json::Value::Null}]})
        };
        conn.write_all(format!("data: {chunk}\n\n").as_bytes())
            .await?;
    }
    let finish =
        serde_json::json!({"choices":[{"index":0,"delta":{},"text":"","finish_reason":"length"}]});
    conn.write_all(format!("data: {finish}\n\n").as_bytes())
        .await?;
    if json["stream_options"]["include_usage"].as_bool() == Some(true) {
        let usage =
            serde_json::json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":n}});
        conn.write_all(format!("data: {usage}\n\n").as_bytes())
            .await?;
    }
    conn.write_all(b"data: [DONE]\n\n").await?;
    Ok(())
}

/// The request records a run wrote to `dir/requests.jsonl`.
pub fn records(dir: &std::path::Path) -> Vec<nyann_load::RequestRecord> {
    std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// (conversation, turn) of each measured record of stage `stage`, in send order.
pub fn turns_of(dir: &std::path::Path, stage: usize) -> Vec<(u64, u32)> {
    let mut recs: Vec<_> = records(dir)
        .into_iter()
        .filter(|r| r.stage == stage && r.phase == nyann_load::Phase::Measured)
        .collect();
    recs.sort_by_key(|r| r.id);
    recs.iter().map(|r| (r.conversation, r.turn)).collect()
}

/// The turns of stage 0 of one stream over a pool of three conversations
/// running 7 turns: the three fresh conversations first, then the least
/// recently used comes back, one turn at a time.
pub fn assert_one_stream_over_three(dir: &std::path::Path) {
    let turns = turns_of(dir, 0);
    let ids: Vec<u64> = turns.iter().take(3).map(|t| t.0).collect();
    let expected: Vec<(u64, u32)> = [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)]
        .iter()
        .map(|&(i, turn)| (ids[i], turn))
        .collect();
    assert_eq!(turns, expected);
}
