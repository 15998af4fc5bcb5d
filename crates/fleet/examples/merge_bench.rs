//! Times the fleet's merge (`nyann_fleet::merge::write`) on synthetic
//! workers' records, for `bench/fleet-merge.sh`, which builds this example
//! at two revisions and runs both on the same files.
//!
//! ```text
//! merge_bench gen DIR WORKERS RECORDS  write DIR/worker-I/requests.jsonl, RECORDS in all
//! merge_bench merge DIR WORKERS OUT    merge them into OUT; print seconds and peak RSS
//! merge_bench compare A B              the same records, line by line, as JSON values?
//! ```
//!
//! The records have the shape of a real run's (`generate` against
//! `sim --profile fast`): the fields in the order nyann-bench writes them,
//! an `itl_s` list of mostly `0.0` gaps, a few failures with an error, two
//! stages (a warm-up and a measured one), about 600 bytes a line.

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nyann_fleet::merge::{FleetRun, RecordsFile, WorkerRun};
use nyann_load::{Phase, RequestRecord, RunResult, Status, TokenSource};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| -> Result<&str, Error> {
        args.get(i)
            .map(String::as_str)
            .ok_or_else(|| "usage: merge_bench gen|merge|compare ... (see the source)".into())
    };
    match arg(0)? {
        "gen" => generate(Path::new(arg(1)?), arg(2)?.parse()?, arg(3)?.parse()?),
        "merge" => merge(Path::new(arg(1)?), arg(2)?.parse()?, Path::new(arg(3)?)),
        "compare" => compare(Path::new(arg(1)?), Path::new(arg(2)?)),
        other => Err(format!("unknown command {other}").into()),
    }
}

/// A small deterministic generator (xorshift64*): the same files every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn generate(dir: &Path, workers: usize, records: u64) -> Result<(), Error> {
    let start = 1_796_290_380.968_188_5;
    for worker in 0..workers {
        let own = dir.join(format!("worker-{worker}"));
        std::fs::create_dir_all(&own)?;
        let mut out = BufWriter::new(std::fs::File::create(own.join("requests.jsonl"))?);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (worker as u64 + 1));
        let count =
            records / workers as u64 + u64::from((worker as u64) < records % workers as u64);
        for i in 0..count {
            let stage = usize::from(i >= count / 10);
            let sent = start + i as f64 * 0.002 + rng.unit() * 0.001;
            let ok = rng.below(50) != 0;
            let ttft = (2_000_000 + rng.below(10_000_000)) as f64 / 1e9;
            let gaps = 10 + rng.below(50) as usize;
            let itl_s: Vec<f64> = (0..gaps)
                .map(|_| {
                    if rng.below(3) == 0 {
                        (1_000_000 + rng.below(1_000_000)) as f64 / 1e9
                    } else {
                        0.0
                    }
                })
                .collect();
            let e2e = ((ttft + itl_s.iter().sum::<f64>()) * 1e9).round() / 1e9;
            let record = RequestRecord {
                id: worker as u64 * 1_000_000_000 + i,
                conversation: worker as u64 * 1_000_000_000 + i,
                turn: 1,
                stage,
                phase: if stage == 0 {
                    Phase::Warmup
                } else {
                    Phase::Measured
                },
                status: if ok { Status::Ok } else { Status::Failed },
                scheduled_at: None,
                sent_at: Some(sent),
                first_token_at: ok.then_some(sent + ttft),
                end_at: Some(sent + e2e),
                ttft_s: ok.then_some(ttft),
                e2e_s: ok.then_some(e2e),
                itl_s: if ok { itl_s } else { Vec::new() },
                chunk_tokens: Vec::new(),
                prompt_tokens: None,
                cached_tokens: None,
                output_tokens: ok.then_some(3 * gaps as u64),
                output_tokens_source: ok.then_some(TokenSource::Chunks),
                prompt_chars: 512,
                finish_reason: ok.then(|| "length".to_string()),
                response_id: ok.then(|| format!("chatcmpl-{i}")),
                http_status: Some(if ok { 200 } else { 500 }),
                error: (!ok).then(|| "HTTP 500: {\"error\": \"overloaded\"}".to_string()),
                client_lag_s: Some(rng.below(2_000_000) as f64 / 1e9),
                resent: false,
                client_error: false,
                eval_expected: None,
                eval_extracted: None,
                eval_correct: None,
                tpot_s: None,
                slo_met: None,
                slo_missed: Vec::new(),
            };
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(())
}

/// A run result of the two stages the records were sent in.
fn result() -> Result<RunResult, Error> {
    let stage = |index: usize, status: &str| {
        serde_json::json!({
            "index": index, "label": format!("#{index} c=8"), "name": null,
            "status": status, "mode": "concurrent", "concurrency": 8, "rate": null,
            "duration_s": 60.0, "start_unix": 1_796_290_380.0 + 60.0 * index as f64,
            "end_unix": 1_796_290_440.0 + 60.0 * index as f64,
            "client": null, "detail": null, "annotation": null, "skip_reason": null,
        })
    };
    Ok(serde_json::from_value(serde_json::json!({
        "outcome": {"kind": "completed"},
        "start_unix": 1_796_290_380.0, "end_unix": 1_796_290_500.0, "seed": 1,
        "models": [], "targets": [],
        "totals": nyann_model::ClientStats::default(),
        "totals_detail": nyann_load::StageDetail::default(),
        "requests_recorded": 0,
        "stages": [stage(0, "warmup"), stage(1, "measured")],
    }))?)
}

fn merge(dir: &Path, workers: usize, out: &Path) -> Result<(), Error> {
    let stage = serde_json::json!({"stage": {
        "name": null, "duration_s": 60.0, "mode": "concurrent", "concurrency": 8,
        "rate": null, "max_inflight": 0, "max_requests": 0, "rampup_s": null,
        "workload": null, "target": null, "model": null, "warmup": false,
        "conversation_pool_size": 0, "stop": null, "location": null,
    }});
    let scenario: nyann_model::Scenario = serde_json::from_value(serde_json::json!({
        "target": null, "model": null,
        "workload": {"type": "faker", "isl": 128, "osl": 256, "turns": 1,
            "subsequent_isl": null, "corpus_path": null, "chars_per_token": 0.0,
            "cache_salt": null, "name": null},
        "steps": [stage.clone(), stage],
    }))?;
    let records =
        |worker: usize| -> PathBuf { dir.join(format!("worker-{worker}/requests.jsonl")) };
    let mut runs = Vec::new();
    for worker in 1..workers {
        let path = records(worker);
        let bytes = std::fs::metadata(&path)?.len();
        runs.push(WorkerRun {
            worker,
            result: result()?,
            records: Some(RecordsFile { path, bytes }),
            records_error: None,
            decision_waits: Vec::new(),
        });
    }
    let fleet = FleetRun {
        workers,
        seed: 1,
        leader: result()?,
        leader_records: Some(records(0)),
        runs,
        judgements: BTreeMap::new(),
        departed: Vec::new(),
        missing: Vec::new(),
        aborted: None,
        presence: BTreeMap::new(),
        shares: vec![scenario.clone(); workers],
        scenario,
    };
    std::fs::create_dir_all(out)?;
    let started = Instant::now();
    let merged = nyann_fleet::merge::write(&fleet, out)?;
    let seconds = started.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    println!(
        "merge seconds={seconds:.3} records={} peak_rss_kib={peak_kib}",
        merged.result.requests_recorded
    );
    Ok(())
}

/// Both files hold the same records in the same order (each line the same
/// JSON value); says whether they are also the same bytes.
fn compare(a: &Path, b: &Path) -> Result<(), Error> {
    let open = |p: &Path| -> Result<_, Error> {
        Ok(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(p)?,
        ))
    };
    let (mut a_lines, mut b_lines) = (open(a)?.split(b'\n'), open(b)?.split(b'\n'));
    let (mut lines, mut same_bytes) = (0u64, true);
    loop {
        match (a_lines.next(), b_lines.next()) {
            (None, None) => break,
            (Some(x), Some(y)) => {
                let (x, y) = (x?, y?);
                lines += 1;
                if x != y {
                    same_bytes = false;
                    let xv: serde_json::Value = serde_json::from_slice(&x)?;
                    let yv: serde_json::Value = serde_json::from_slice(&y)?;
                    if xv != yv {
                        return Err(format!("line {lines} differs").into());
                    }
                }
            }
            _ => return Err(format!("one file ends at line {}", lines + 1).into()),
        }
    }
    println!(
        "compare lines={lines} same_values=yes same_bytes={}",
        if same_bytes { "yes" } else { "no" }
    );
    Ok(())
}
