//! Reading scenario files: only regular files, never more than the size
//! limit (checked while reading, not from metadata), and errors that say what
//! the file is, where a byte is wrong, and each OS error once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use nyann_scenario::{MAX_SOURCE_BYTES, ScenarioError, load_file};

/// `load_file(path)` on another thread: a read that blocks or never ends
/// fails the test after 20 s instead of hanging it.
fn load_bounded(path: &Path) -> Result<nyann_scenario::Scenario, ScenarioError> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(load_file(&path));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("load_file did not return within 20 s")
}

fn symlink(target: &str, dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(target, &link).unwrap();
    link
}

#[test]
fn a_device_behind_a_star_name_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let zero = symlink("/dev/zero", dir.path(), "z.star");
    let err = load_bounded(&zero).unwrap_err().to_string();
    assert!(
        err.contains("z.star") && err.contains("character device") && err.contains("/dev/zero"),
        "{err}"
    );
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("x.star");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = load_bounded(&fifo).unwrap_err().to_string();
    assert!(
        err.contains("x.star") && err.contains("FIFO (named pipe)"),
        "{err}"
    );
}

#[test]
fn a_directory_is_named_as_such_whatever_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("scenarios");
    let starry = dir.path().join("d.star");
    for path in [&plain, &starry] {
        std::fs::create_dir(path).unwrap();
        let err = load_bounded(path).unwrap_err().to_string();
        assert!(
            err.contains("is a directory") && err.contains(".star"),
            "{err}"
        );
        assert!(!err.contains("unsupported scenario file type"), "{err}");
        assert!(!err.contains("os error"), "{err}");
    }
}

#[test]
fn the_size_limit_holds_while_reading() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.star");
    std::fs::write(&big, "#".repeat(MAX_SOURCE_BYTES + 1)).unwrap();
    let err = load_bounded(&big).unwrap_err().to_string();
    assert!(
        err.contains(&format!("the limit is {MAX_SOURCE_BYTES} bytes")),
        "{err}"
    );
    // Exactly at the limit is read (and then compiled).
    std::fs::write(&big, "#".repeat(MAX_SOURCE_BYTES)).unwrap();
    let err = load_bounded(&big).unwrap_err().to_string();
    assert!(!err.contains("the limit is"), "{err}");
}

#[test]
fn an_os_error_is_said_once() {
    let err = load_file(Path::new("/nonexistent/x.star")).unwrap_err();
    // As the CLI prints it: the error and its sources.
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(
        chain.matches("No such file or directory").count(),
        1,
        "{chain}"
    );
}

#[test]
fn non_utf8_text_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u.star");
    std::fs::write(&path, b"scenario(stages=[stage(\"1s\")])\n# caf\xe9\n").unwrap();
    let err = load_bounded(&path).unwrap_err();
    let d = &err.diagnostics()[0];
    assert_eq!((d.line, d.column), (Some(2), Some(6)), "{err}");
    assert!(
        d.message.contains("not UTF-8") && d.message.contains("at byte offset 36"),
        "{err}"
    );
}

/// An eval dataset's relative path is the scenario file's neighbour,
/// whatever the directory the run starts in; an absolute one is kept.
#[test]
fn eval_dataset_paths_are_taken_from_the_scenario_files_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evals.star");
    std::fs::write(
        &path,
        "scenario(stages = [\n    stage(\"1s\", workload = workload(\"gsm8k\", path = \"data/test.jsonl\", train_path = \"/abs/train.jsonl\", fewshot = 2)),\n])\n",
    )
    .unwrap();
    let scenario = load_file(&path).unwrap();
    let nyann_model::Step::Stage(stage) = &scenario.steps[0] else {
        panic!("a stage");
    };
    let workload = stage.workload.as_ref().unwrap();
    assert_eq!(
        workload.path.as_deref(),
        Some(dir.path().join("data/test.jsonl").to_str().unwrap())
    );
    assert_eq!(workload.train_path.as_deref(), Some("/abs/train.jsonl"));
    assert_eq!(workload.fewshot, 2);
}

/// A ShareGPT file's relative path too; its turns and length limits are kept.
#[test]
fn a_sharegpt_path_is_taken_from_the_scenario_files_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("replay.star");
    std::fs::write(
        &path,
        "scenario(workload = workload(\"sharegpt\", path = \"ShareGPT_V3.json\", turns = 3, max_isl = 1024, max_osl = 512), stages = [stage(\"1s\")])\n",
    )
    .unwrap();
    let scenario = load_file(&path).unwrap();
    let workload = &scenario.workload;
    assert_eq!(workload.kind, nyann_model::WorkloadType::ShareGpt);
    assert_eq!(
        workload.path.as_deref(),
        Some(dir.path().join("ShareGPT_V3.json").to_str().unwrap())
    );
    assert_eq!(
        (workload.turns, workload.max_isl, workload.max_osl),
        (3, 1024, 512)
    );
    // The IR spells the type as the scenario does, and reads back.
    let json = serde_json::to_string(&scenario).unwrap();
    assert!(json.contains("\"type\":\"sharegpt\""), "{json}");
    assert!(json.contains("\"max_isl\":1024"), "{json}");
    let back: nyann_model::Scenario = serde_json::from_str(&json).unwrap();
    assert_eq!(back, scenario);
}
