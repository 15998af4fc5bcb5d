//! The run directory: what a run writes, its file names, and the one place
//! that reads a finished run back (the report, replay and `sim fit` all go
//! through [`RunDir`]).
//!
//! [`RunDir`] writes `stages.json`, `summary.json`, the scenario,
//! `server.json` and `metrics/`. The other files are written where they
//! are made, under the names defined here: `requests.jsonl` by the load
//! runner's record writer (`nyann_load::record`), streamed as requests
//! complete, and in a fleet by the leader's merge (`nyann_fleet::merge`),
//! which reads each worker's records as the bytes the worker reported and
//! also writes `fleet.json`; `report.html` by `nyann_report::write_html`.
//!
//! | file | what | written |
//! |------|------|---------|
//! | `requests.jsonl` | one record per request | streamed during the run |
//! | `stages.json` | per step of the scenario, as run | at the end |
//! | `summary.json` | the run: outcome, totals, stages, conclusion | at the end |
//! | `scenario.json`, `scenario.star` | the compiled scenario and its source | at the end |
//! | `report.html` | the report | at the end |
//! | `server.json` | what the servers said about themselves: `/v1/models`, `/tokenize` | before the load |
//! | `metrics/ROLE-I-{start,end}.txt` | each `--scrape` URL's `/metrics` text | at the start and the end |
//!
//! `stages.json` and `summary.json` carry a `schema_version`
//! ([`SCHEMA_VERSION`]); users' pipelines read these files, so their shape
//! changes only with that number. Version 0 is what runs wrote before the
//! field existed (`stages.json` a bare array); it is still read. This crate
//! knows the envelope, not the records: each reader says what it
//! deserializes, so a tool that needs three fields of a stage reads three.

use std::io::BufRead;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The version of `stages.json` and `summary.json` this build writes, and
/// the newest it reads.
///
/// - 1: `stages.json` is an object, `{"schema_version": 1, "stages": [...]}`
///   (version 0 was the bare array); `summary.json` gains `schema_version`.
/// - 2: SLOs and goodput: a stage's `client.slo` (and the totals'), a
///   stage's `slo` in the scenario; each request's `tpot_s`, `slo_met` and
///   `slo_missed` in `requests.jsonl`. Every new field is optional: version
///   1 files read as before. A judged stage's `congestion.policy.origin`
///   may be an OCI reference pinned by digest
///   (`oci://REGISTRY/REPO:TAG@sha256:...`), where it was `builtin` or a
///   file path.
pub const SCHEMA_VERSION: u32 = 2;

/// One JSON record per request, one per line.
pub const REQUESTS: &str = "requests.jsonl";
/// Each step of the scenario as run.
pub const STAGES: &str = "stages.json";
/// The run's outcome, totals, stages and conclusion (also printed on stdout).
pub const SUMMARY: &str = "summary.json";
/// The compiled scenario.
pub const SCENARIO: &str = "scenario.json";
/// The scenario as written (Starlark), when the run was given one.
pub const SCENARIO_SOURCE: &str = "scenario.star";
/// The HTML report.
pub const REPORT: &str = "report.html";
/// What the servers said about themselves before the load (their models,
/// their tokenizer): what `sim fit` needs besides the records.
pub const SERVER: &str = "server.json";
/// The folder of the scraped servers' `/metrics` texts.
pub const METRICS: &str = "metrics";

/// Files whose presence means a directory holds a run's results.
const RESULT_FILES: [&str; 3] = [SUMMARY, STAGES, REQUESTS];

/// Why a run directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "{} is not a directory: give the results directory of a run",
        .0.display()
    )]
    NotADirectory(PathBuf),
    #[error(
        "{} holds no {file}: give the results directory of a run",
        dir.display()
    )]
    Missing { dir: PathBuf, file: String },
    /// (The cause is part of each message, not a `source`: a printed
    /// error chain says it once.)
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} is not {what} nyann-bench wrote: {error}", path.display())]
    Malformed {
        path: PathBuf,
        what: &'static str,
        error: serde_json::Error,
    },
    #[error(
        "{} was written by a newer nyann-bench (schema_version {found}; this one reads up \
         to {SCHEMA_VERSION}): read it with that version or a newer one",
        path.display()
    )]
    Newer { path: PathBuf, found: u32 },
}

/// A directory that holds (or will hold) a run's files.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// The run directory at `path`, to write into (nothing is checked).
    pub fn at(path: impl Into<PathBuf>) -> RunDir {
        RunDir { path: path.into() }
    }

    /// The run directory at `path`, to read: it must be a directory.
    pub fn open(path: impl Into<PathBuf>) -> Result<RunDir, ReadError> {
        let path = path.into();
        if !path.is_dir() {
            return Err(ReadError::NotADirectory(path));
        }
        Ok(RunDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of one of its files (`REQUESTS`, `STAGES`...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The first result file already there, if the directory holds a run.
    pub fn held_result(&self) -> Option<(&'static str, PathBuf)> {
        RESULT_FILES
            .into_iter()
            .map(|name| (name, self.file(name)))
            .find(|(_, path)| path.exists())
    }

    /// The stages of the run: `stages.json`, else the `stages` of
    /// `summary.json` (a run cut short may have written only one).
    pub fn stages<T: DeserializeOwned>(&self) -> Result<Vec<T>, ReadError> {
        #[derive(Deserialize)]
        struct Stages<T> {
            stages: Vec<T>,
        }
        let (path, text) = match self.read_text(STAGES) {
            Err(ReadError::Missing { .. }) => {
                return self
                    .summary::<Stages<T>>()
                    .map(|s| s.stages)
                    .map_err(|err| match err {
                        ReadError::Missing { dir, .. } => ReadError::Missing {
                            dir,
                            file: format!("{STAGES} or {SUMMARY}"),
                        },
                        err => err,
                    });
            }
            read => read?,
        };
        let what = "a stages.json";
        if text.trim_start().starts_with('[') {
            // Version 0: the bare array.
            return serde_json::from_str(&text).map_err(malformed(&path, what));
        }
        check_version(&path, &text, what)?;
        serde_json::from_str(&text)
            .map(|s: Stages<T>| s.stages)
            .map_err(malformed(&path, what))
    }

    /// `summary.json`, as `T` (fields `T` does not name are ignored).
    pub fn summary<T: DeserializeOwned>(&self) -> Result<T, ReadError> {
        let (path, text) = self.read_text(SUMMARY)?;
        let what = "a summary.json";
        check_version(&path, &text, what)?;
        serde_json::from_str(&text).map_err(malformed(&path, what))
    }

    /// `scenario.json`, if the run saved it.
    pub fn scenario<T: DeserializeOwned>(&self) -> Result<Option<T>, ReadError> {
        match self.read_text(SCENARIO) {
            Ok((path, text)) => serde_json::from_str(&text)
                .map(Some)
                .map_err(malformed(&path, "a scenario.json")),
            Err(ReadError::Missing { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The scenario's source, if the run was given one.
    pub fn scenario_source(&self) -> Option<String> {
        std::fs::read_to_string(self.file(SCENARIO_SOURCE)).ok()
    }

    /// The request records, streamed (None when the run wrote none).
    pub fn records<T: DeserializeOwned>(&self) -> Result<Option<Records<T>>, ReadError> {
        let path = self.file(REQUESTS);
        match std::fs::File::open(&path) {
            Ok(file) => Ok(Some(Records::new(path, file, u64::MAX))),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(ReadError::Io { path, error }),
        }
    }

    /// Writes `stages.json`, whole or not at all: a reader watching a
    /// running run (which rewrites it after each stage) never sees half a
    /// file.
    pub fn write_stages<T: Serialize>(&self, stages: &[T]) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(&StagesFile {
            schema_version: SCHEMA_VERSION,
            stages,
        })
        .map_err(std::io::Error::other)?;
        let partial = self.file(".stages.json.partial");
        std::fs::write(&partial, json)?;
        std::fs::rename(partial, self.file(STAGES))
    }

    /// Writes `summary.json`: `summary` (a JSON object) with the schema version.
    pub fn write_summary<T: Serialize>(&self, summary: &T) -> std::io::Result<()> {
        let json = summary_json(summary).map_err(std::io::Error::other)?;
        std::fs::write(self.file(SUMMARY), json)
    }

    /// Writes the compiled scenario and, if given, its source.
    pub fn write_scenario<T: Serialize>(
        &self,
        scenario: &T,
        source: Option<&str>,
    ) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(scenario).map_err(std::io::Error::other)?;
        std::fs::write(self.file(SCENARIO), json)?;
        match source {
            Some(source) => std::fs::write(self.file(SCENARIO_SOURCE), source),
            None => Ok(()),
        }
    }

    /// Writes `server.json`.
    pub fn write_server<T: Serialize>(&self, facts: &T) -> std::io::Result<()> {
        let json = serde_json::to_vec_pretty(facts).map_err(std::io::Error::other)?;
        std::fs::write(self.file(SERVER), json)
    }

    /// `server.json`, if the run wrote it (runs before it existed did not).
    pub fn server<T: DeserializeOwned>(&self) -> Result<Option<T>, ReadError> {
        match self.read_text(SERVER) {
            Ok((path, text)) => serde_json::from_str(&text)
                .map(Some)
                .map_err(malformed(&path, "a server.json")),
            Err(ReadError::Missing { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Writes the `/metrics` text of `role`'s `index`th URL at `moment`
    /// (`start`, `end`) into `metrics/`.
    pub fn write_metrics(
        &self,
        role: &str,
        index: usize,
        moment: &str,
        text: &str,
    ) -> std::io::Result<()> {
        let dir = self.file(METRICS);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("{role}-{index}-{moment}.txt")), text)
    }

    /// The saved `/metrics` texts taken at `moment`, as (role, path), in
    /// role and URL order.
    pub fn metrics_texts(&self, moment: &str) -> Vec<(String, PathBuf)> {
        let suffix = format!("-{moment}.txt");
        let Ok(entries) = std::fs::read_dir(self.file(METRICS)) else {
            return Vec::new();
        };
        let mut found: Vec<(String, PathBuf)> = entries
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let name = path.file_name()?.to_str()?;
                let (role, _index) = name.strip_suffix(&suffix)?.rsplit_once('-')?;
                Some((role.to_string(), path))
            })
            .collect();
        found.sort();
        found
    }

    fn read_text(&self, name: &str) -> Result<(PathBuf, String), ReadError> {
        let path = self.file(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok((path, text)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(ReadError::Missing {
                dir: self.path.clone(),
                file: name.to_string(),
            }),
            Err(error) => Err(ReadError::Io { path, error }),
        }
    }
}

/// `stages.json`: the stages (`T`), versioned.
#[derive(Serialize, schemars::JsonSchema)]
pub struct StagesFile<'a, T> {
    /// The version of this file's shape: 1 (absent in files written before it existed).
    pub schema_version: u32,
    /// Each step of the scenario, as run, in order.
    pub stages: &'a [T],
}

/// `summary.json`: the summary (`T`, a JSON object), versioned.
#[derive(Serialize, schemars::JsonSchema)]
pub struct SummaryFile<'a, T> {
    /// The version of this file's shape: 1 (absent in files written before it existed).
    pub schema_version: u32,
    #[serde(flatten)]
    pub summary: &'a T,
}

/// `summary` (a JSON object) with the schema version, as `summary.json`
/// holds it and `generate` prints it on stdout.
pub fn summary_json<T: Serialize>(summary: &T) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&SummaryFile {
        schema_version: SCHEMA_VERSION,
        summary,
    })
}

/// Refuses a file written with a newer schema than this build reads.
fn check_version(path: &Path, text: &str, what: &'static str) -> Result<(), ReadError> {
    #[derive(Deserialize)]
    struct Version {
        #[serde(default)]
        schema_version: u32,
    }
    let found = serde_json::from_str::<Version>(text)
        .map_err(malformed(path, what))?
        .schema_version;
    if found > SCHEMA_VERSION {
        return Err(ReadError::Newer {
            path: path.to_path_buf(),
            found,
        });
    }
    Ok(())
}

fn malformed(path: &Path, what: &'static str) -> impl Fn(serde_json::Error) -> ReadError {
    move |error| ReadError::Malformed {
        path: path.to_path_buf(),
        what,
        error,
    }
}

/// A request record that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading the file failed: nothing after it can be read.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// One line is not a record (cut short by a crash, or not nyann-bench's).
    #[error("{}:{line}: not a request record of nyann-bench: {error}", path.display())]
    Line {
        path: PathBuf,
        line: u64,
        error: serde_json::Error,
    },
    /// A line longer than any record: nothing after it is read.
    #[error(
        "{}:{line}: a line longer than {} MiB is no request record of nyann-bench (the rest of \
         the file is not read)",
        path.display(),
        MAX_RECORD_LINE >> 20
    )]
    TooLong { path: PathBuf, line: u64 },
}

/// The longest line read as a record (a record with the inter-chunk
/// latencies of 100,000 output tokens takes about 1.5 MB).
pub const MAX_RECORD_LINE: u64 = 16 << 20;

/// The records of a `requests.jsonl`, read one line at a time (memory does
/// not grow with the file); blank lines are skipped.
pub struct Records<T> {
    path: PathBuf,
    reader: std::io::BufReader<std::io::Take<std::fs::File>>,
    line: String,
    number: u64,
    failed: bool,
    record: PhantomData<T>,
}

impl<T: DeserializeOwned> Records<T> {
    /// The records of the file at `path` (any name), up to its first
    /// `max_bytes` bytes: a file still being written yields what it had.
    pub fn open(path: &Path, max_bytes: u64) -> std::io::Result<Records<T>> {
        Ok(Records::new(
            path.to_path_buf(),
            std::fs::File::open(path)?,
            max_bytes,
        ))
    }

    fn new(path: PathBuf, file: std::fs::File, max_bytes: u64) -> Records<T> {
        use std::io::Read;
        Records {
            path,
            reader: std::io::BufReader::with_capacity(1 << 20, file.take(max_bytes)),
            line: String::new(),
            number: 0,
            failed: false,
            record: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Iterator for Records<T> {
    type Item = Result<T, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed {
            self.line.clear();
            use std::io::Read;
            match (&mut self.reader)
                .take(MAX_RECORD_LINE)
                .read_line(&mut self.line)
            {
                Ok(0) => return None,
                Ok(n) if n as u64 >= MAX_RECORD_LINE && !self.line.ends_with('\n') => {
                    self.failed = true;
                    return Some(Err(RecordError::TooLong {
                        path: self.path.clone(),
                        line: self.number + 1,
                    }));
                }
                Ok(_) => {}
                Err(error) => {
                    self.failed = true;
                    return Some(Err(RecordError::Io {
                        path: self.path.clone(),
                        error,
                    }));
                }
            }
            self.number += 1;
            if self.line.trim().is_empty() {
                continue;
            }
            return Some(
                serde_json::from_str(&self.line).map_err(|error| RecordError::Line {
                    path: self.path.clone(),
                    line: self.number,
                    error,
                }),
            );
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn stages_and_summary_round_trip_with_the_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::at(dir.path());
        run.write_stages(&[json!({"index": 0}), json!({"index": 1})])
            .unwrap();
        run.write_summary(&json!({"seed": 7, "stages": [{"index": 0}]}))
            .unwrap();

        let on_disk: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(STAGES)).unwrap()).unwrap();
        assert_eq!(on_disk["schema_version"], SCHEMA_VERSION);
        let summary: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(SUMMARY)).unwrap()).unwrap();
        assert_eq!(summary["schema_version"], SCHEMA_VERSION);
        assert_eq!(summary["seed"], 7);

        let run = RunDir::open(dir.path()).unwrap();
        let stages: Vec<Value> = run.stages().unwrap();
        assert_eq!(stages, [json!({"index": 0}), json!({"index": 1})]);
    }

    #[test]
    fn version_0_files_are_read() {
        let dir = dir_with(&[(STAGES, r#"[{"index": 3}]"#)]);
        let stages: Vec<Value> = RunDir::open(dir.path()).unwrap().stages().unwrap();
        assert_eq!(stages, [json!({"index": 3})]);
    }

    #[test]
    fn without_stages_json_the_summary_gives_the_stages() {
        let dir = dir_with(&[(SUMMARY, r#"{"stages": [{"index": 2}]}"#)]);
        let stages: Vec<Value> = RunDir::open(dir.path()).unwrap().stages().unwrap();
        assert_eq!(stages, [json!({"index": 2})]);
    }

    #[test]
    fn a_newer_schema_is_refused_with_what_to_do() {
        let dir = dir_with(&[
            (STAGES, r#"{"schema_version": 99, "stages": "changed"}"#),
            (SUMMARY, r#"{"schema_version": 99}"#),
        ]);
        let run = RunDir::open(dir.path()).unwrap();
        let err = run.stages::<Value>().unwrap_err().to_string();
        assert!(
            err.contains("newer nyann-bench (schema_version 99; this one reads up to 2)"),
            "{err}"
        );
        assert!(matches!(
            run.summary::<Value>(),
            Err(ReadError::Newer { found: 99, .. })
        ));
    }

    #[test]
    fn missing_and_malformed_files_are_named() {
        let empty = tempfile::tempdir().unwrap();
        let err = RunDir::open(empty.path())
            .unwrap()
            .stages::<Value>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "holds no stages.json or summary.json: give the results directory of a run"
            ),
            "{err}"
        );
        let file = empty.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            RunDir::open(&file),
            Err(ReadError::NotADirectory(_))
        ));

        let bad = dir_with(&[(STAGES, "{\"schema_version\": 1, \"stages\": 3}")]);
        let err = RunDir::open(bad.path())
            .unwrap()
            .stages::<Value>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is not a stages.json nyann-bench wrote"),
            "{err}"
        );
    }

    #[test]
    fn records_stream_skipping_blank_lines_and_naming_bad_ones() {
        let dir = dir_with(&[(REQUESTS, "{\"id\": 1}\n\n{\"id\": 2\n{\"id\": 3}\n")]);
        let run = RunDir::open(dir.path()).unwrap();
        let read: Vec<Result<Value, RecordError>> = run.records().unwrap().unwrap().collect();
        assert_eq!(read.len(), 3);
        assert_eq!(read[0].as_ref().unwrap()["id"], 1);
        let bad = read[1].as_ref().unwrap_err().to_string();
        assert!(
            bad.contains("requests.jsonl:3: not a request record"),
            "{bad}"
        );
        assert_eq!(read[2].as_ref().unwrap()["id"], 3);

        let limited: Vec<_> = Records::<Value>::open(&dir.path().join(REQUESTS), 10)
            .unwrap()
            .collect();
        assert_eq!(limited.len(), 1, "only the first line fits in 10 bytes");

        // A line without end (here /dev/zero: zeros forever) is read up to
        // the bound, said, and nothing after it.
        let mut endless = Records::<Value>::open(Path::new("/dev/zero"), u64::MAX).unwrap();
        let err = endless.next().unwrap().unwrap_err().to_string();
        assert_eq!(
            err,
            "/dev/zero:1: a line longer than 16 MiB is no request record of nyann-bench (the rest \
             of the file is not read)"
        );
        assert!(endless.next().is_none());

        let none = tempfile::tempdir().unwrap();
        assert!(
            RunDir::open(none.path())
                .unwrap()
                .records::<Value>()
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_directory_holds_a_run_once_a_result_file_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::at(dir.path());
        assert!(run.held_result().is_none());
        std::fs::write(dir.path().join(REQUESTS), "").unwrap();
        assert_eq!(run.held_result().unwrap().0, REQUESTS);
    }
}
