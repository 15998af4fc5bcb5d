//! Client-side Prometheus metrics (`--metrics ADDR`): a minimal HTTP/1.1
//! responder serving the live counters in the text exposition format.
//! Names are prefixed `nyann_`.

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::live::{Buckets, Live, LiveSnapshot};

/// Serves `GET /metrics` on `addr` until the runtime ends; returns the bound address.
pub async fn serve(addr: SocketAddr, live: Arc<Live>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    live.enable_histograms();
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let live = live.clone();
            tokio::spawn(async move {
                // Read the request head (bounded); only the path matters.
                let mut head = Vec::with_capacity(1024);
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let ok = head.starts_with(b"GET /metrics ") || head.starts_with(b"GET / ");
                let (status, body) = if ok {
                    ("200 OK", render(&live))
                } else {
                    ("404 Not Found", "try /metrics\n".to_string())
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(bound)
}

/// The exposition text of the current counters.
pub fn render(live: &Live) -> String {
    let mut out = String::with_capacity(4096);
    let snap = live.snapshot();
    let _ = writeln!(out, "# HELP nyann_requests_total Requests by final status.");
    let _ = writeln!(out, "# TYPE nyann_requests_total counter");
    for (status, counter) in [
        ("ok", &live.ok),
        ("failed", &live.failed),
        ("rejected", &live.rejected),
        ("late", &live.late),
        ("cancelled", &live.cancelled),
        ("dropped", &live.dropped),
    ] {
        let _ = writeln!(
            out,
            "nyann_requests_total{{status=\"{status}\"}} {}",
            counter.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP nyann_requests_in_flight Requests sent and not yet finished."
    );
    let _ = writeln!(out, "# TYPE nyann_requests_in_flight gauge");
    let _ = writeln!(out, "nyann_requests_in_flight {}", snap.in_flight);
    eval(&mut out, live, &snap);
    goodput(&mut out, live, &snap);
    let _ = writeln!(
        out,
        "# HELP nyann_stage_index Index of the current stage (-1 before the first)."
    );
    let _ = writeln!(out, "# TYPE nyann_stage_index gauge");
    let _ = writeln!(
        out,
        "nyann_stage_index {}",
        snap.stage_index.map(|i| i as i64).unwrap_or(-1)
    );
    histogram(
        &mut out,
        "nyann_time_to_first_token_seconds",
        "Client-side time to first token.",
        &live.ttft,
    );
    histogram(
        &mut out,
        "nyann_inter_chunk_latency_seconds",
        "Client-side gaps between text chunks.",
        &live.itl,
    );
    histogram(
        &mut out,
        "nyann_e2e_request_latency_seconds",
        "Client-side request latency.",
        &live.e2e,
    );
    out
}

/// The eval counters under the Go tool's names (so its dashboards work),
/// and the current stage's accuracy.
fn eval(out: &mut String, live: &Live, snap: &LiveSnapshot) {
    // `correct` first: a reply is counted in `scored` before `correct`, so
    // a reply finishing between the two reads cannot make `correct` exceed
    // `scored` (the saturating difference guards the weak ordering).
    let correct = live.eval.correct.load(Ordering::Relaxed);
    let scored = live.eval.scored.load(Ordering::Relaxed);
    let unanswerable = live.eval.unanswerable.load(Ordering::Relaxed);
    counters(
        out,
        [
            ("nyann_eval_total", "Eval replies scored.", scored),
            (
                "nyann_eval_correct",
                "Eval replies with the right answer.",
                correct,
            ),
            (
                "nyann_eval_incorrect",
                "Eval replies with a wrong answer or none.",
                scored.saturating_sub(correct),
            ),
            (
                "nyann_eval_unanswerable",
                "Eval replies in which no answer was found (counted incorrect too).",
                unanswerable,
            ),
        ],
    );
    let _ = writeln!(
        out,
        "# HELP nyann_eval_accuracy Right answers among the current stage's scored eval replies (absent before one is scored)."
    );
    let _ = writeln!(out, "# TYPE nyann_eval_accuracy gauge");
    if snap.stage_eval_scored > 0 {
        let accuracy = snap.stage_eval_correct as f64 / snap.stage_eval_scored as f64;
        let _ = writeln!(out, "nyann_eval_accuracy {accuracy}");
    }
}

/// The requests judged against their stage's SLO: `rate()` of
/// `nyann_goodput_requests_total` is the goodput.
fn goodput(out: &mut String, live: &Live, snap: &LiveSnapshot) {
    let met = live.slo.met.load(Ordering::Relaxed);
    let judged = live.slo.judged.load(Ordering::Relaxed);
    counters(
        out,
        [
            (
                "nyann_goodput_requests_total",
                "Requests that met every goal of their stage's SLO.",
                met,
            ),
            (
                "nyann_goodput_judged_total",
                "Requests judged against their stage's SLO (failed, rejected, dropped and late ones missed it).",
                judged,
            ),
        ],
    );
    let name = "nyann_goodput_missed_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests that missed this goal of their stage's SLO."
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    for objective in nyann_model::Objective::ALL {
        let missed = live.slo.missed[objective.index()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{goal=\"{}\"}} {missed}", objective.name());
    }
    let _ = writeln!(
        out,
        "# HELP nyann_goodput_attainment Share of the current stage's judged requests that met its SLO (absent before one is judged)."
    );
    let _ = writeln!(out, "# TYPE nyann_goodput_attainment gauge");
    if snap.stage_slo_judged > 0 {
        let attainment = snap.stage_slo_met as f64 / snap.stage_slo_judged as f64;
        let _ = writeln!(out, "nyann_goodput_attainment {attainment}");
    }
}

/// Counters, each with its HELP and TYPE lines.
fn counters<const N: usize>(out: &mut String, counters: [(&str, &str, u64); N]) {
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {value}");
    }
}

fn histogram(out: &mut String, name: &str, help: &str, buckets: &Buckets) {
    let (cumulative, sum, count) = buckets.snapshot();
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, n) in buckets.bounds.iter().zip(&cumulative) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {count}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RequestRecord;

    #[tokio::test]
    async fn serves_counters_and_histograms() {
        let live = Arc::new(Live::new());
        live.enable_histograms();
        live.ttft.observe(0.003);
        live.ttft.observe(0.5);
        live.ok.fetch_add(2, Ordering::Relaxed);
        let addr = serve("127.0.0.1:0".parse().unwrap(), live).await.unwrap();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        conn.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK"));
        assert!(text.contains("nyann_requests_total{status=\"ok\"} 2"));
        assert!(text.contains("nyann_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("nyann_time_to_first_token_seconds_bucket{le=\"0.5\"} 2"));
        assert!(text.contains("nyann_time_to_first_token_seconds_count 2"));
        assert!(text.contains("nyann_stage_index -1"));
        assert!(text.contains("nyann_eval_total 0\n"));
        assert!(
            !text.contains("nyann_eval_accuracy 0"),
            "no stage scored yet"
        );
    }

    #[test]
    fn counts_requests_judged_against_the_slo_and_the_stages_attainment() {
        let live = Live::new();
        let goals = nyann_model::Slo {
            ttft_s: Some(0.5),
            ..nyann_model::Slo::default()
        };
        let judged = |status, ttft: f64| {
            let mut record = RequestRecord::sample(status);
            record.stage = 1;
            record.ttft_s = Some(ttft);
            record.e2e_s = Some(ttft + 1.0);
            crate::goodput::judge(&mut record, Some(&goals));
            record
        };
        assert!(!render(&live).contains("nyann_goodput_attainment 0"));
        live.stage_started(1, "#1 c=4", 10.0, false);
        for record in [
            judged(crate::record::Status::Ok, 0.1),
            judged(crate::record::Status::Ok, 0.9),
            judged(crate::record::Status::Failed, 0.1),
            judged(crate::record::Status::Ok, 0.2),
        ] {
            live.finished(&record);
        }
        let text = render(&live);
        for line in [
            "nyann_goodput_requests_total 2\n",
            "nyann_goodput_judged_total 4\n",
            "nyann_goodput_missed_total{goal=\"ttft\"} 2\n",
            "nyann_goodput_missed_total{goal=\"tpot\"} 0\n",
            "nyann_goodput_attainment 0.5\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }

    #[test]
    fn counts_scored_eval_replies_and_the_stages_accuracy() {
        let live = Live::new();
        let reply = |extracted: Option<&str>, correct: Option<bool>| {
            let mut record = RequestRecord::sample(crate::record::Status::Ok);
            record.stage = 1;
            record.eval_extracted = extracted.map(str::to_string);
            record.eval_correct = correct;
            record
        };
        live.stage_started(0, "#0 c=4", 10.0, false);
        live.finished(&reply(Some("4"), Some(true)));
        live.stage_started(1, "#1 c=4", 10.0, false);
        // Stage 0's last replies, still finishing, count in the totals
        // but not in stage 1's accuracy.
        let late = RequestRecord {
            stage: 0,
            ..reply(Some("5"), Some(false))
        };
        live.finished(&late);
        for record in [
            reply(Some("4"), Some(true)),
            reply(Some("5"), Some(false)),
            reply(None, Some(false)),
            reply(Some("4"), Some(true)),
            reply(None, None),
        ] {
            live.finished(&record);
        }
        let text = render(&live);
        for line in [
            "nyann_eval_total 6\n",
            "nyann_eval_correct 3\n",
            "nyann_eval_incorrect 3\n",
            "nyann_eval_unanswerable 1\n",
            "nyann_eval_accuracy 0.5\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
    }
}
