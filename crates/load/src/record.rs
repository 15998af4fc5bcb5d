//! One line of `requests.jsonl`: everything measured about one request, and
//! the writer that streams those lines to disk as requests complete.
//!
//! Durability bound: the writer task drains a channel of at most
//! [`RECORD_QUEUE`] records into a 64 KiB buffered file and flushes whenever
//! the channel is momentarily empty (and at the end), so a crash loses at most
//! the queued records plus one 64 KiB buffer of lines; a normal end, an abort
//! and Ctrl-C lose nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Capacity of the channel between request tasks and the writer.
pub const RECORD_QUEUE: usize = 4096;
const WRITE_BUFFER: usize = 64 * 1024;

/// Why a stage's requests were sent: counted, warm-up, or held load between stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Sent during a measured stage: counts in its statistics.
    Measured,
    /// Sent during a warm-up stage: excluded from statistics.
    Warmup,
    /// Sent after a stage ended, while the stage hook decided (the finished
    /// stage's level held): excluded from every stage's statistics.
    Hold,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Failed,
    /// Open loop: the arrival found `max_inflight` requests in flight and was not sent.
    Dropped,
    /// Still in flight when the run was interrupted and the grace period ran out.
    Cancelled,
}

/// Where the output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// The number of chunks that carried text (usage absent).
    Chunks,
}

/// One request. Times are unix seconds; durations are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Unique within the run, in send (or drop) order.
    pub id: u64,
    /// The conversation (one per closed-loop conversation or open-loop arrival).
    pub conversation: u64,
    /// 1-based turn within the conversation.
    pub turn: u32,
    /// Index of the stage (in the scenario's steps, barriers counted) in which it was sent.
    pub stage: usize,
    pub phase: Phase,
    pub status: Status,
    /// Open loop: when the arrival was due (first turns only).
    pub scheduled_at: Option<f64>,
    /// Just before the request was handed to the HTTP client (None if dropped).
    pub sent_at: Option<f64>,
    pub first_token_at: Option<f64>,
    pub end_at: Option<f64>,
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    /// Gaps between consecutive chunks that carried text.
    pub itl_s: Vec<f64>,
    /// Tokens in each text chunk, when the server reports usage per chunk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_tokens: Vec<u32>,
    pub prompt_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub output_tokens_source: Option<TokenSource>,
    /// Characters of prompt text sent in this turn (the new user message).
    pub prompt_chars: usize,
    pub finish_reason: Option<String>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

/// Streams records to `requests.jsonl` (or discards them without an output dir).
#[derive(Clone)]
pub struct RecordSink {
    tx: Option<mpsc::Sender<RequestRecord>>,
}

/// The writer task's handle: await it to flush and close the file.
pub struct RecordWriter {
    task: Option<tokio::task::JoinHandle<std::io::Result<u64>>>,
    pub path: Option<PathBuf>,
}

impl RecordSink {
    /// Opens `dir/requests.jsonl` (truncating it) and starts the writer.
    pub fn create(dir: Option<&Path>) -> std::io::Result<(RecordSink, RecordWriter)> {
        let Some(dir) = dir else {
            return Ok((
                RecordSink { tx: None },
                RecordWriter {
                    task: None,
                    path: None,
                },
            ));
        };
        let path = dir.join("requests.jsonl");
        let file = std::fs::File::create(&path)?;
        let (tx, rx) = mpsc::channel(RECORD_QUEUE);
        let task = tokio::task::spawn_blocking(move || write_records(file, rx));
        Ok((
            RecordSink { tx: Some(tx) },
            RecordWriter {
                task: Some(task),
                path: Some(path),
            },
        ))
    }

    /// Queues a record (waits if the writer is [`RECORD_QUEUE`] records behind).
    pub async fn send(&self, record: RequestRecord) {
        if let Some(tx) = &self.tx {
            // The writer only stops early on a disk error, which it reports itself.
            let _ = tx.send(record).await;
        }
    }
}

impl RecordWriter {
    /// Waits until every queued record is on disk; returns how many were written.
    /// Every [`RecordSink`] clone must have been dropped first.
    pub async fn finish(mut self) -> std::io::Result<u64> {
        match self.task.take() {
            None => Ok(0),
            Some(task) => task.await.map_err(std::io::Error::other)?,
        }
    }
}

fn write_records(
    file: std::fs::File,
    mut rx: mpsc::Receiver<RequestRecord>,
) -> std::io::Result<u64> {
    let mut out = std::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut written = 0u64;
    while let Some(record) = rx.blocking_recv() {
        write_line(&mut out, &record)?;
        written += 1;
        while let Ok(record) = rx.try_recv() {
            write_line(&mut out, &record)?;
            written += 1;
        }
        out.flush()?;
    }
    out.flush()?;
    Ok(written)
}

fn write_line(out: &mut impl Write, record: &RequestRecord) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, record).map_err(std::io::Error::other)?;
    out.write_all(b"\n")
}
