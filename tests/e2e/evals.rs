//! Eval datasets under load: GSM8K and GPQA files (made by
//! `nyann_testkit::datasets`) asked against the simulator, which answers
//! right with a known probability; accuracy is one more stage figure.

use std::collections::BTreeMap;

use nyann_sim::SimConfig;
use serde_json::Value;

use crate::support::generate_at;

/// The scored records of a run, and its one stage's eval figures.
fn scored(run: &crate::support::Run) -> (Vec<Value>, Value) {
    let text = std::fs::read_to_string(run.dir().join("requests.jsonl")).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["phase"] == "measured")
        .collect();
    let eval = run.stages()[0]["client"]["eval"].clone();
    (records, eval)
}

/// 200 GSM8K questions, answered right 70% of the time: the stage asks
/// each once (max_requests defaults to the dataset's size), scores every
/// reply, and its accuracy's 95% interval holds 70%.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gsm8k_stage_asks_each_question_once_and_scores_the_replies() {
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("test.jsonl");
    nyann_testkit::datasets::write_gsm8k(&path, 200);
    let sim = nyann_sim::start(SimConfig {
        seed: 3,
        profile: nyann_sim::Profile::Fast,
        eval_gsm8k: Some(path.clone()),
        eval_accuracy: 0.7,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let scenario = format!(
        "scenario(stages = [stage(\"60s\", concurrency=8, workload=workload(\"gsm8k\", path={:?}, osl=6))])\n",
        path.display().to_string()
    );
    let run = generate_at(&sim.base_url(), &scenario, &[]).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let (records, eval) = scored(&run);
    assert_eq!(records.len(), 200, "each question once");
    let mut asked: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        *asked
            .entry(r["eval_expected"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert_eq!(
            r["eval_correct"],
            r["eval_extracted"] == r["eval_expected"],
            "{r}"
        );
    }
    assert_eq!(
        asked.len(),
        200,
        "200 different answers: every question once"
    );
    assert_eq!(eval["answered"], 200, "{eval}");
    assert_eq!(eval["unanswerable"], 0, "{eval}");
    let correct = records.iter().filter(|r| r["eval_correct"] == true).count();
    assert_eq!(eval["correct"], correct);
    let (low, high) = (
        eval["accuracy_low"].as_f64().unwrap(),
        eval["accuracy_high"].as_f64().unwrap(),
    );
    assert!(low < 0.7 && 0.7 < high, "{eval}");
    assert!(run.stderr().contains("accuracy"), "{}", run.stderr());
    crate::support::validate_against_schema(run.dir());
}

/// GPQA's CSV, choices shuffled by the run's seed: the simulator reads the
/// right letter from the prompt and answers it half the time; a reply cut
/// before its letter (osl=1: `Answer:` only) is unanswerable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpqa_stage_scores_the_letter_and_counts_unanswerable_replies() {
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("gpqa.csv");
    nyann_testkit::datasets::write_gpqa_csv(&path, 120);
    let sim = nyann_sim::start(SimConfig {
        seed: 5,
        profile: nyann_sim::Profile::Fast,
        eval_gpqa: Some(path.clone()),
        eval_accuracy: 0.5,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let stage = |osl: u32| {
        format!(
            "stage(\"60s\", concurrency=4, workload=workload(\"gpqa\", path={:?}, osl={osl}))",
            path.display().to_string()
        )
    };
    let scenario = format!("scenario(stages = [{}, {}])\n", stage(4), stage(1));
    let run = generate_at(&sim.base_url(), &scenario, &[]).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let answered = &run.stages()[0]["client"]["eval"];
    assert_eq!(answered["answered"], 120, "{answered}");
    let (low, high) = (
        answered["accuracy_low"].as_f64().unwrap(),
        answered["accuracy_high"].as_f64().unwrap(),
    );
    assert!(low < 0.5 && 0.5 < high, "{answered}");
    let cut = &run.stages()[1]["client"]["eval"];
    assert_eq!(cut["unanswerable"], 120, "{cut}");
    assert_eq!(cut["correct"], 0, "{cut}");
}

/// `--metrics` serves the eval counters under the Go tool's names: read
/// while a second (plain) stage runs, they hold every reply the eval stage
/// scored (the measured ones and those sent beyond its `max_requests`),
/// as `requests.jsonl` records them; the plain stage has no accuracy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_metrics_count_the_scored_replies() {
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("test.jsonl");
    nyann_testkit::datasets::write_gsm8k(&path, 50);
    let sim = nyann_sim::start(SimConfig {
        profile: nyann_sim::Profile::Fast,
        eval_gsm8k: Some(path.clone()),
        eval_accuracy: 0.5,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let scenario = data.path().join("scenario.star");
    std::fs::write(
        &scenario,
        "scenario(stages = [\n    stage(\"60s\", concurrency=4, workload=workload(\"gsm8k\", path=\"test.jsonl\", osl=6)),\n    stage(\"3s\", concurrency=1),\n])\n",
    )
    .unwrap();
    let stderr = data.path().join("stderr");
    let mut child = crate::support::nyann_bench()
        .arg("generate")
        .arg("--config")
        .arg(&scenario)
        .arg("--output-dir")
        .arg(data.path().join("out"))
        .args(["--target", &sim.base_url(), "--metrics", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    // The address, then the second stage's start.
    let mut address = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&stderr).unwrap_or_default();
        address = address.or_else(|| {
            let rest = text.split("client metrics: http://").nth(1)?;
            Some(rest.split('/').next()?.to_string())
        });
        if address.is_some() && text.contains("stage #1 c=1: started") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The eval stage's replies sent beyond its max_requests may still be
    // in flight: read once only the plain stage's one stream is.
    let address = address.unwrap().parse().unwrap();
    let text = loop {
        let text = crate::support::http_get(address, "/metrics").await;
        if text.lines().any(|l| l == "nyann_requests_in_flight 1") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let status = child.wait().await.unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&stderr).unwrap()
    );
    let records: Vec<Value> = std::fs::read_to_string(data.path().join("out/requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let scored = |value: Option<bool>| {
        records
            .iter()
            .filter(|r| r["eval_correct"].as_bool().is_some())
            .filter(|r| value.is_none_or(|v| r["eval_correct"] == v))
            .count() as u64
    };
    let counter = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line[name.len() + 1..].parse().unwrap()
    };
    assert!(scored(None) >= 50, "each question at least once");
    assert_eq!(counter("nyann_eval_total"), scored(None), "{text}");
    assert_eq!(counter("nyann_eval_correct"), scored(Some(true)), "{text}");
    assert_eq!(
        counter("nyann_eval_incorrect"),
        scored(Some(false)),
        "{text}"
    );
    assert!(
        !text.contains("\nnyann_eval_accuracy "),
        "the plain stage scores nothing: no accuracy\n{text}"
    );
}

/// A server that answers worse under load: right 90% of the time, 10%
/// once more than 4 requests are in flight. The example policy
/// `accuracy-drop` (client figures only: no signal source) stops the GSM8K
/// sweep 1, 2, 4, 16 at c=16, the first level that can be busy (how busy
/// depends on the client's turnaround: most of its requests are), and
/// says by how much the accuracy fell against c=1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accuracy_drop_policy_stops_where_the_server_answers_worse() {
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("test.jsonl");
    nyann_testkit::datasets::write_gsm8k(&path, 80);
    let sim = nyann_sim::start(SimConfig {
        seed: 7,
        profile: nyann_sim::Profile::Fast,
        eval_gsm8k: Some(path.clone()),
        eval_accuracy: 0.9,
        eval_busy_accuracy: Some(0.1),
        eval_busy_above: 4,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let policy = crate::support::policy_wasm("accuracy-drop-policy");
    let scenario = format!(
        "questions = workload(\"gsm8k\", path={:?}, osl=6)\n\
         scenario(stages = until_congested(\n    \
         [stage(\"60s\", concurrency=c, workload=questions) for c in [1, 2, 4, 16, 32]],\n    \
         max_drop=0.2,\n))\n",
        path.display().to_string()
    );
    let args = ["--policy".to_string(), policy.display().to_string()];
    let run = generate_at(&sim.base_url(), &scenario, &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(3), "{}", run.stderr());
    let stages = run.stages();
    for (index, stage) in stages.iter().enumerate().take(3) {
        let eval = &stage["client"]["eval"];
        assert_eq!(eval["answered"], 80, "stage {index}: {eval}");
        assert!(eval["accuracy_high"].as_f64().unwrap() > 0.9, "{eval}");
    }
    let congestion = run.congestion(3);
    assert_eq!(congestion["policy"]["name"], "accuracy-drop");
    let reason = congestion["verdict"]["reasons"][0].as_str().unwrap();
    assert!(reason.contains("points below #0 c=1's"), "{reason}");
    assert_eq!(stages[4]["status"], "skipped");
}

/// The Go tool's shortcuts: `eval gsm8k` (few-shot from a train file) and
/// `eval gpqa` each run one stage that asks every question once at
/// `--concurrency`, with `--max-tokens` as each reply's limit; the
/// simulator answers every question right, so every reply scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eval_commands_ask_each_question_once() {
    let data = tempfile::tempdir().unwrap();
    let (test, train, gpqa) = (
        data.path().join("test.jsonl"),
        data.path().join("train.jsonl"),
        data.path().join("gpqa.csv"),
    );
    nyann_testkit::datasets::write_gsm8k(&test, 40);
    nyann_testkit::datasets::write_gsm8k(&train, 10);
    nyann_testkit::datasets::write_gpqa_csv(&gpqa, 30);
    for (dataset, flags, questions) in [
        (
            "gsm8k",
            vec![
                "--gsm8k-path",
                path(&test),
                "--gsm8k-train-path",
                path(&train),
            ],
            40,
        ),
        ("gpqa", vec!["--gpqa-path", path(&gpqa)], 30),
    ] {
        let sim = nyann_sim::start(SimConfig {
            seed: 3,
            profile: nyann_sim::Profile::Fast,
            eval_gsm8k: (dataset == "gsm8k").then(|| test.clone()),
            eval_gpqa: (dataset == "gpqa").then(|| gpqa.clone()),
            eval_accuracy: 1.0,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let out = tempfile::tempdir().unwrap();
        let output = crate::support::nyann_bench()
            .args(["eval", dataset])
            .args(&flags)
            .args(["--concurrency", "4", "--max-tokens", "6", "--seed", "2"])
            .args(["--target", &sim.base_url(), "--output-dir"])
            .arg(out.path())
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        let summary: Value = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("summary.json")).unwrap(),
        )
        .unwrap();
        let stages = summary["stages"].as_array().unwrap();
        assert_eq!(stages.len(), 1, "one stage");
        assert_eq!(stages[0]["concurrency"], 4);
        let eval = &stages[0]["client"]["eval"];
        assert_eq!(eval["answered"], questions, "{dataset}: {eval}");
        assert_eq!(eval["correct"], questions, "{dataset}: {eval}");
        let requests = std::fs::read_to_string(out.path().join("requests.jsonl")).unwrap();
        let measured = requests
            .lines()
            .filter(|l| l.contains("\"phase\":\"measured\""))
            .count();
        assert_eq!(measured, questions, "{dataset}: each question once");
        assert!(stderr.contains("accuracy"), "{stderr}");
    }

    fn path(p: &std::path::Path) -> &str {
        p.to_str().unwrap()
    }
}
