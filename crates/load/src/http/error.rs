//! Why a request got no (complete) response, and whether the client itself
//! (its file descriptors, ports or memory) rather than the server failed.

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
    /// The cause is in the message (not a `source`, or it is said twice).
    #[error("connection error: {0}")]
    Io(std::io::Error),
    #[error("the server closed the connection {0}")]
    Closed(&'static str),
    #[error("invalid response: {0}")]
    Protocol(String),
    /// The pooled connection the request was written into had been closed
    /// by the server; the new connection it was sent on failed too.
    #[error("{0} (sent again on a new connection: the kept-alive one had been closed)")]
    Resent(Box<HttpError>),
}

impl From<std::io::Error> for HttpError {
    fn from(error: std::io::Error) -> Self {
        HttpError::Io(error)
    }
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
pub(super) fn is_client_side(error: &std::io::Error) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
