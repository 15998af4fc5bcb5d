//! A real headless browser for the report's tests: Debian's chromium,
//! driven over the DevTools protocol (a WebSocket to 127.0.0.1). Only what
//! the tests need: open a page, collect console errors, evaluate an
//! expression, take a screenshot. Every wait is bounded.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// Longest wait for any one answer of the browser.
const WAIT: Duration = Duration::from_secs(30);

/// The browser binary: `NYANN_CHROMIUM`, else Debian's `/usr/bin/chromium`.
fn chromium() -> PathBuf {
    std::env::var_os("NYANN_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Every event received so far.
    events: Vec<Value>,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts a headless chromium with an empty profile and no background
    /// network, and attaches to a new blank page.
    pub fn launch() -> Browser {
        let binary = chromium();
        assert!(
            binary.exists(),
            "{} not found: the report's browser test needs Debian's chromium \
             (`apt-get install chromium`; .ci/run installs it) or NYANN_CHROMIUM=/path/to/chromium",
            binary.display()
        );
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1280,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("{} did not open its DevTools port", binary.display()));
        let (socket, _) = tungstenite::connect(&url).unwrap();
        if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
        }
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            events: Vec::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page", "Runtime", "Log"] {
            browser.call(&format!("{domain}.enable"), json!({}));
        }
        browser
    }

    /// Sends a command (to the page once attached) and returns its result,
    /// keeping the events that arrive meanwhile.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            let message = self.next_message(deadline, method);
            if message["id"] == json!(id) {
                assert!(
                    message.get("error").is_none(),
                    "{method} failed: {}",
                    message["error"]
                );
                return message["result"].clone();
            }
            self.events.push(message);
        }
    }

    fn next_message(&mut self, deadline: Instant, waiting_for: &str) -> Value {
        loop {
            assert!(
                Instant::now() < deadline,
                "no answer from the browser within {WAIT:?} ({waiting_for})"
            );
            match self.socket.read() {
                Ok(Message::Text(text)) => return serde_json::from_str(&text).unwrap(),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("the browser connection failed ({waiting_for}): {e}"),
            }
        }
    }

    /// Opens `file` and waits for its load event.
    pub fn open(&mut self, file: &Path) {
        let url = format!("file://{}", file.canonicalize().unwrap().display());
        self.open_url(&url);
    }

    /// Opens `url` and waits for its load event.
    pub fn open_url(&mut self, url: &str) {
        // Only a load event after this navigation counts.
        let before = self.events.len();
        self.call("Page.navigate", json!({"url": url}));
        let deadline = Instant::now() + WAIT;
        while !self.events[before..]
            .iter()
            .any(|e| e["method"] == "Page.loadEventFired")
        {
            let event = self.next_message(deadline, "Page.loadEventFired");
            self.events.push(event);
        }
    }

    /// The value of a JavaScript expression (JSON-serialisable; a promise's
    /// once it settles).
    pub fn evaluate(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Errors the page logged: console errors, uncaught exceptions, and the
    /// browser's own messages about the page (e.g. an SVG attribute it could
    /// not parse).
    pub fn console_errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e["method"].as_str()? {
                "Runtime.exceptionThrown" => Some(e["params"]["exceptionDetails"].to_string()),
                "Runtime.consoleAPICalled" if e["params"]["type"] == "error" => {
                    Some(e["params"]["args"].to_string())
                }
                "Log.entryAdded" if e["params"]["entry"]["level"] == "error" => {
                    Some(e["params"]["entry"]["text"].to_string())
                }
                _ => None,
            })
            .collect()
    }

    /// A PNG of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    /// Asks the browser to close (it ends its helper processes), then ends
    /// it by PID if it has not within a few seconds.
    fn drop(&mut self) {
        self.next_id += 1;
        let close = json!({"id": self.next_id, "method": "Browser.close"});
        let _ = self.socket.send(Message::text(close.to_string()));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
