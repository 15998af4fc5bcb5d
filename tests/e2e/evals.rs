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
