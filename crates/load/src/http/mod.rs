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
//!
//! The modules follow a request: `target` (the base URL and the request
//! heads), `pool` (an idle connection or a new one), `connect` (TCP,
//! proxy tunnel, TLS from `tls`), `connection` (the socket and its read
//! buffer), `response` (the head) and `body` (the body's pieces).

mod arrival;
mod body;
mod connect;
mod connection;
mod error;
pub(crate) mod fuzz;
mod pool;
mod proxy;
mod response;
mod scripted;
mod target;
#[cfg(test)]
mod test_support;
mod tls;

pub use self::error::HttpError;
pub use self::proxy::{Proxies, Proxy};
pub use self::response::Response;
pub use self::target::{RequestTemplate, Target, TargetError};
pub use self::tls::read_ca_certs;

/// A response head or chunk-size line may grow the buffer up to this.
const MAX_BUFFER: usize = 64 * 1024;
/// Headers a response head may have.
const MAX_HEADERS: usize = 64;
