//! How long one congestion check takes when Prometheus accepts connections
//! but never answers (a hung server or a stuck proxy), with `--settle-wait
//! 0s` so that no probe runs first. Run by `bench/hanging-prometheus.sh`.
//!
//! Usage: hanging_prometheus [TIMEOUT] [DEPLOY_NAME]   (defaults 10s, the
//! default --prometheus-timeout, and m-decode, i.e. two roles)
//! Prints: roles, signal errors, timeout, queries sent, check seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nyann_signals::{SignalOptions, SignalSource};
use tokio::io::AsyncReadExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let timeout = args.next().unwrap_or_else(|| "10s".into());
    let deploy = args.next().unwrap_or_else(|| "m-decode".into());
    let timeout = nyann_model::parse_duration(&timeout)?;

    // A "Prometheus" that reads each request and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                let mut counted = false;
                // Hold the connection open, counting the request once.
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if !counted {
                        seen.fetch_add(1, Ordering::SeqCst);
                        counted = true;
                    }
                }
            });
        }
    });

    let signal_args = SignalOptions {
        prometheus_url: Some(format!("http://{addr}")),
        deploy_name: Some(deploy),
        settle_wait: Duration::ZERO,
        prometheus_timeout: timeout,
        ..Default::default()
    };
    let source = SignalSource::from_options(&signal_args)
        .await?
        .ok_or("no source")?;
    let roles = source.roles().len();
    let started = Instant::now();
    let signals = source
        .stage_signals(1_000.0, 1_060.0, Default::default())
        .await;
    let took = started.elapsed().as_secs_f64();
    println!(
        "roles {roles}  signal errors {}  timeout {}  queries sent {}  check {took:.1} s",
        signals.errors.len(),
        humantime::format_duration(timeout),
        requests.load(Ordering::SeqCst)
    );
    Ok(())
}
