//! Sending a request: on the most recently used idle connection of the
//! target's pool, or a new one; a request written into a pooled connection
//! the server had closed (no byte came back) is sent once more on a new
//! one. A connection goes back to the pool only after its response was
//! read to the end.

use std::time::{Duration, Instant};

use super::connection::{Connection, Unanswered};
use super::{HttpError, Response, Target};
use crate::lock;

/// Idle connections older than this are closed rather than reused: servers
/// close idle keep-alive connections after a few seconds (uvicorn, which
/// serves vLLM: 5 s), and a request written into a connection the server is
/// closing is lost.
const IDLE_LIMIT: Duration = Duration::from_secs(4);

impl Target {
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
}

impl Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::*;
    use http::header::HeaderMap;
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;

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
}
