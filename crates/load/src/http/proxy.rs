//! Which proxy a target is reached through: `http_proxy`/`HTTP_PROXY` for
//! `http` targets (requests in absolute form), `https_proxy`/`HTTPS_PROXY`
//! for `https` targets (a `CONNECT` tunnel, TLS inside it), `all_proxy` for
//! both, and `no_proxy`/`NO_PROXY` for the hosts reached directly: `*`, a
//! host or IP, or a domain (`example.com` and `.example.com` both match its
//! subdomains), as curl reads them. Loopback targets (`localhost`,
//! `127.0.0.0/8`, `::1`) are always reached directly: a proxy elsewhere
//! cannot reach this host's loopback.

use std::net::IpAddr;

/// A proxy server, from a URL such as `http://user:password@proxy:3128`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub host: String,
    pub port: u16,
    /// `Basic …` from the URL's user name and password, if any.
    pub authorization: Option<String>,
}

/// The proxy settings of the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies {
    http: Option<Proxy>,
    https: Option<Proxy>,
    no_proxy: Vec<String>,
}

impl Proxies {
    /// From the process environment (lower-case spellings first, as curl).
    pub fn from_env() -> Result<Proxies, String> {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        let all = var(&["all_proxy", "ALL_PROXY"]);
        Proxies::parse(
            var(&["http_proxy", "HTTP_PROXY"]).or_else(|| all.clone()),
            var(&["https_proxy", "HTTPS_PROXY"]).or(all),
            var(&["no_proxy", "NO_PROXY"]),
        )
    }

    /// From the values of the variables; a proxy URL that cannot be used is
    /// an error naming it.
    pub fn parse(
        http: Option<String>,
        https: Option<String>,
        no_proxy: Option<String>,
    ) -> Result<Proxies, String> {
        let parse = |value: Option<String>| value.map(|v| parse_proxy(&v)).transpose();
        Ok(Proxies {
            http: parse(http)?,
            https: parse(https)?,
            no_proxy: no_proxy
                .unwrap_or_default()
                .split(',')
                .map(|entry| entry.trim().trim_start_matches('.').to_ascii_lowercase())
                .filter(|entry| !entry.is_empty())
                .collect(),
        })
    }

    /// The proxy for a target on `host` (bare, without brackets), if any.
    pub fn for_target(&self, https: bool, host: &str) -> Option<&Proxy> {
        let proxy = if https { &self.https } else { &self.http };
        let proxy = proxy.as_ref()?;
        let host = host.to_ascii_lowercase();
        let loopback = host == "localhost"
            || host.ends_with(".localhost")
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        let excluded = self.no_proxy.iter().any(|entry| {
            entry == "*"
                || *entry == host
                || host
                    .strip_suffix(entry.as_str())
                    .is_some_and(|rest| rest.ends_with('.'))
        });
        (!loopback && !excluded).then_some(proxy)
    }
}

/// `http://[user:password@]host[:port][/]`; the port defaults to 80 (1080
/// would be a SOCKS proxy, which is not supported).
fn parse_proxy(value: &str) -> Result<Proxy, String> {
    let value = value.trim();
    let bad = |why: &str| format!("proxy {value:?}: {why}");
    // curl accepts a bare host:port as an http proxy.
    let url = if value.contains("://") {
        value.to_string()
    } else {
        format!("http://{value}")
    };
    let uri: http::Uri = url.parse().map_err(|e| bad(&format!("not a URL: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("only http:// proxies are supported"));
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    let (userinfo, _) = match authority.as_str().rsplit_once('@') {
        Some((userinfo, host)) => (Some(userinfo), host),
        None => (None, authority.as_str()),
    };
    let authorization = userinfo.map(|userinfo| {
        use base64::Engine;
        let decoded = percent_encoding::percent_decode_str(userinfo).decode_utf8_lossy();
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(decoded.as_bytes())
        )
    });
    let host = authority.host();
    Ok(Proxy {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port: authority.port_u16().unwrap_or(80),
        authorization,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(no_proxy: &str) -> Proxies {
        Proxies::parse(
            Some("http://127.0.0.1:3128".into()),
            Some("proxy.corp:8080".into()),
            Some(no_proxy.into()),
        )
        .unwrap()
    }

    #[test]
    fn proxies_per_scheme_and_no_proxy_as_curl() {
        let p = proxies(" .internal, models.example.com ,10.0.0.7");
        assert_eq!(
            p.for_target(false, "gpu.example.org").map(|p| p.port),
            Some(3128)
        );
        let https = p.for_target(true, "gpu.example.org").unwrap();
        assert_eq!((https.host.as_str(), https.port), ("proxy.corp", 8080));
        for direct in [
            "a.internal",
            "internal",
            "models.example.com",
            "v1.models.example.com",
            "10.0.0.7",
            "localhost",
            "127.0.0.1",
            "::1",
        ] {
            assert_eq!(p.for_target(false, direct), None, "{direct}");
        }
        // A suffix must end at a dot.
        assert!(p.for_target(false, "notinternal").is_some());
        assert!(p.for_target(false, "10.0.0.70").is_some());
        assert_eq!(proxies("*").for_target(true, "anything"), None);
        assert_eq!(Proxies::default().for_target(false, "anything"), None);
    }

    #[test]
    fn proxy_urls_with_credentials_and_errors() {
        let p =
            Proxies::parse(Some("http://us%40r:p%3Ass@[::1]:3128/".into()), None, None).unwrap();
        let proxy = p.http.unwrap();
        assert_eq!((proxy.host.as_str(), proxy.port), ("::1", 3128));
        // base64("us@r:p:ss")
        assert_eq!(proxy.authorization.as_deref(), Some("Basic dXNAcjpwOnNz"));
        let err = Proxies::parse(None, Some("socks5://proxy:1080".into()), None).unwrap_err();
        assert!(
            err.contains("socks5://proxy:1080") && err.contains("only http://"),
            "{err}"
        );
    }
}
