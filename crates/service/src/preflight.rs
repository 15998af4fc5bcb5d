//! The signal preflight at plan time: a scenario that stops on congestion
//! is planned only when its target's signal source answers now and finds
//! the server's series, so that `until_congested` never fails at start.
//! The answer names the source's URLs by their place in the targets file:
//! clients never see a target's addresses.

use std::time::Duration;

use nyann_signals::{ScrapeTarget, Server, SignalOptions, SignalSource};

use crate::targets::SignalSource as Source;

/// How long the preflight may take (one query per role, or one scrape of
/// each URL, each with its own timeout).
pub const PREFLIGHT_TIME: Duration = Duration::from_secs(20);

/// The preflight's warnings (signals missing on a role), or why the source
/// cannot serve a congestion check.
pub async fn check(source: &Source) -> Result<Vec<String>, String> {
    let redact = |text: String| redact(source, text);
    let scrape = source
        .scrape
        .iter()
        .map(|entry| entry.parse::<ScrapeTarget>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| redact(e.to_string()))?;
    let options = SignalOptions {
        prometheus_url: source.prometheus_url.clone(),
        deploy_name: source.deploy_name.clone(),
        scrape,
        server: match source.server.as_deref() {
            Some("sglang") => Server::Sglang,
            _ => Server::Vllm,
        },
        ..SignalOptions::default()
    };
    let checked = async {
        match SignalSource::from_options(&options).await? {
            Some(signals) => signals.preflight().await,
            None => Ok(Vec::new()),
        }
    };
    match tokio::time::timeout(PREFLIGHT_TIME, checked).await {
        Err(_) => Err(format!(
            "it did not answer within {} s",
            PREFLIGHT_TIME.as_secs()
        )),
        Ok(Err(e)) => Err(redact(e.to_string())),
        Ok(Ok(warnings)) => Ok(warnings.iter().map(|w| redact(w.to_string())).collect()),
    }
}

/// `text` with each of the source's URLs replaced by its field's name.
fn redact(source: &Source, mut text: String) -> String {
    if let Some(url) = &source.prometheus_url {
        text = text.replace(url.trim_end_matches('/'), "[signals.prometheus_url]");
    }
    for (i, entry) in source.scrape.iter().enumerate() {
        let url = entry.split_once('=').map_or(entry.as_str(), |(_, url)| url);
        text = text.replace(url, &format!("[signals.scrape[{i}]]"));
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_are_named_by_their_field() {
        let source = Source {
            prometheus_url: Some("http://prom.internal:9090/".into()),
            scrape: vec!["decode=http://10.0.0.7:8000/metrics".into()],
            ..Source::default()
        };
        let text =
            "no series in Prometheus http://prom.internal:9090 nor at http://10.0.0.7:8000/metrics";
        let shown = redact(&source, text.to_string());
        assert_eq!(
            shown,
            "no series in Prometheus [signals.prometheus_url] nor at [signals.scrape[0]]"
        );
    }
}
