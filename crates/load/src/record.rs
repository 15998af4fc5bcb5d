//! One line of `requests.jsonl`: everything measured about one request, and
//! the writer that streams those lines to disk as requests complete.
//!
//! Request tasks serialise their record into a shared buffer; a full 64 KiB
//! buffer, or whatever is buffered every [`FLUSH_INTERVAL`] (250 ms), goes to
//! a writer thread that appends it to the file with one `write`. Few wakeups
//! and syscalls per record, so recording costs little at high request rates.
//!
//! Durability bound: a crash (kill -9, power loss) loses at most the lines of
//! the last 250 ms or 64 KiB (whichever is less) plus the buffers queued for
//! the writer (at most [`RECORD_QUEUE`] x 64 KiB while the disk lags); a
//! normal end, an abort and Ctrl-C lose nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// Buffers that may wait for the writer before request tasks wait for the disk.
pub const RECORD_QUEUE: usize = 16;
/// How often buffered lines are handed to the writer.
pub const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);
const WRITE_BUFFER: usize = 64 * 1024;

thread_local! {
    /// One record's line while it is encoded (reused: records are encoded on
    /// the runtime's few worker threads, never across an await).
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Why a stage's requests were sent: counted, warm-up, or held load between stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// An error: a broken server (5xx, refused connection, protocol error,
    /// timeout), a bad request (4xx) or the client's own failure.
    Failed,
    /// The server shed it: HTTP 429, or 503 with `Retry-After`. Not an
    /// error (it never counts toward `--max-consecutive-errors`).
    Rejected,
    /// Open loop: the arrival found `max_inflight` requests in flight and was not sent.
    Dropped,
    /// Still in flight when the run was interrupted and the grace period ran out.
    Cancelled,
    /// Still in flight when its stage's drain time ran out: abandoned so
    /// the next stage could start (not an error; in no latency statistic).
    Late,
}

/// Where the output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// The number of chunks that carried text (usage absent).
    Chunks,
}

/// One request. Times are unix seconds; durations are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Of `prompt_tokens`, those the server's prefix cache served
    /// (`usage.prompt_tokens_details.cached_tokens`; vLLM reports it with
    /// `--enable-prompt-tokens-details`). Absent when the server did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub output_tokens_source: Option<TokenSource>,
    /// Characters of prompt text sent in this turn (the new user message).
    pub prompt_chars: usize,
    pub finish_reason: Option<String>,
    /// The server's id of the response (`chatcmpl-…`, the `id` of its
    /// chunks): finds the request in the server's logs.
    #[serde(default)]
    pub response_id: Option<String>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    /// The longest a read of the response came after its bytes arrived
    /// (known with the kernel's receive timestamps): how far the client
    /// lagged behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_lag_s: Option<f64>,
    /// Sent a second time on a new connection: the kept-alive one it was
    /// written into had been closed by the server, with no answer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub resent: bool,
    /// The failure was the client's own (out of file descriptors, local
    /// ports, buffers): the client is the cause, not the server.
    #[serde(default, skip_serializing_if = "is_false")]
    pub client_error: bool,
    /// An eval request (GSM8K, GPQA): the answer that scores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_expected: Option<String>,
    /// The answer read from the reply (absent: none found, or no reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_extracted: Option<String>,
    /// Whether the reply was right; absent when no reply came to score.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_correct: Option<bool>,
    /// Time per output token after the first, as vLLM defines it:
    /// `(e2e_s - ttft_s) / (output_tokens - 1)`; absent with fewer than two
    /// output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    /// Whether it met every goal of its stage's SLO; absent when the stage
    /// has none, and for a request cancelled by an interrupt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_met: Option<bool>,
    /// The goals of the SLO it missed (all of them when it got no answer:
    /// failed, rejected, dropped or late).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slo_missed: Vec<nyann_model::Objective>,
}

impl RequestRecord {
    /// An open-loop arrival that found `max_inflight` requests in flight:
    /// never sent.
    pub(crate) fn dropped(
        id: u64,
        conversation: u64,
        stage: usize,
        phase: Phase,
        scheduled_at: f64,
    ) -> Self {
        RequestRecord {
            id,
            conversation,
            turn: 1,
            stage,
            phase,
            status: Status::Dropped,
            scheduled_at: Some(scheduled_at),
            sent_at: None,
            first_token_at: None,
            end_at: None,
            ttft_s: None,
            e2e_s: None,
            itl_s: Vec::new(),
            chunk_tokens: Vec::new(),
            prompt_tokens: None,
            cached_tokens: None,
            output_tokens: None,
            output_tokens_source: None,
            prompt_chars: 0,
            finish_reason: None,
            response_id: None,
            http_status: None,
            error: Some("max_inflight requests in flight: arrival dropped".into()),
            client_lag_s: None,
            resent: false,
            client_error: false,
            eval_expected: None,
            eval_extracted: None,
            eval_correct: None,
            tpot_s: None,
            slo_met: None,
            slo_missed: Vec::new(),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !b
}

#[cfg(test)]
impl RequestRecord {
    /// A measured request of conversation 0, turn 1, sent at 0, with no
    /// timings: tests fill in what they look at.
    pub(crate) fn sample(status: Status) -> RequestRecord {
        RequestRecord {
            status,
            scheduled_at: None,
            sent_at: Some(0.0),
            error: None,
            ..RequestRecord::dropped(0, 0, 0, Phase::Measured, 0.0)
        }
    }
}

/// Streams records to `requests.jsonl` (or discards them without an output dir).
#[derive(Clone)]
pub struct RecordSink {
    inner: Option<Arc<SinkInner>>,
    /// Records received (counted with or without an output dir).
    lines: Arc<AtomicU64>,
}

struct SinkInner {
    /// Serialised lines not yet handed to the writer.
    buffer: Mutex<Vec<u8>>,
    tx: mpsc::Sender<Vec<u8>>,
}

/// The writer task's handle: await it to flush and close the file.
pub struct RecordWriter {
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    pub path: Option<PathBuf>,
    failure: WriteFailure,
}

/// Why the records stopped reaching the disk, once they did: the runner
/// stops the load then (records that cannot be kept are not worth sending).
#[derive(Debug, Clone, Default)]
pub struct WriteFailure {
    failed: tokio_util::sync::CancellationToken,
    why: Arc<OnceLock<String>>,
}

impl WriteFailure {
    fn fail(&self, why: String) {
        tracing::error!("{why}");
        let _ = self.why.set(why);
        self.failed.cancel();
    }

    /// Waits for a failure, and says it.
    pub async fn wait(&self) -> String {
        self.failed.cancelled().await;
        self.why.get().cloned().unwrap_or_default()
    }

    /// The failure, if there was one.
    pub fn get(&self) -> Option<&str> {
        self.why.get().map(String::as_str)
    }
}

impl RecordSink {
    /// Opens `dir/requests.jsonl` (truncating it) and starts the writer.
    pub fn create(dir: Option<&Path>) -> std::io::Result<(RecordSink, RecordWriter)> {
        let Some(dir) = dir else {
            return Ok((
                RecordSink {
                    inner: None,
                    lines: Arc::default(),
                },
                RecordWriter {
                    task: None,
                    path: None,
                    failure: WriteFailure::default(),
                },
            ));
        };
        let path = dir.join(nyann_results::REQUESTS);
        let file = std::fs::File::create(&path)?;
        let (tx, rx) = mpsc::channel(RECORD_QUEUE);
        let failure = WriteFailure::default();
        let task = {
            let (path, failure) = (path.clone(), failure.clone());
            tokio::task::spawn_blocking(move || write_chunks(file, &path, rx, &failure))
        };
        let inner = Arc::new(SinkInner {
            buffer: Mutex::new(Vec::with_capacity(WRITE_BUFFER + 4096)),
            tx,
        });
        Ok((
            RecordSink {
                inner: Some(inner),
                lines: Arc::default(),
            },
            RecordWriter {
                task: Some(task),
                path: Some(path),
                failure,
            },
        ))
    }

    /// Adds a record; hands a full 64 KiB buffer to the writer (waiting if
    /// the writer is [`RECORD_QUEUE`] buffers behind).
    ///
    /// The record is serialised when this is called, not when the future
    /// is polled: the future holds only a full buffer, if any. (An `async
    /// fn` would keep the record in every request's future, and that is
    /// memory held per stream.)
    pub fn send(&self, record: RequestRecord) -> impl Future<Output = ()> + Send + '_ {
        self.lines.fetch_add(1, Ordering::Relaxed);
        let full = self.inner.as_ref().and_then(|inner| {
            // Serialise outside the lock, into this thread's reused line
            // buffer (no allocation per record); a record always serialises.
            LINE.with_borrow_mut(|line| {
                line.clear();
                if let Err(err) = serde_json::to_writer(&mut *line, &record) {
                    tracing::error!("cannot encode request record {}: {err}", record.id);
                    return None;
                }
                line.push(b'\n');
                let mut buffer = crate::lock(&inner.buffer);
                buffer.extend_from_slice(line);
                (buffer.len() >= WRITE_BUFFER).then(|| {
                    std::mem::replace(&mut *buffer, Vec::with_capacity(WRITE_BUFFER + 4096))
                })
            })
            .map(|chunk| (&inner.tx, chunk))
        });
        async move {
            if let Some((tx, chunk)) = full {
                // The writer only stops early on a disk error, which it reports itself.
                let _ = tx.send(chunk).await;
            }
        }
    }

    /// Hands whatever is buffered to the writer (called every
    /// [`FLUSH_INTERVAL`] by the runner and at the end).
    pub async fn flush(&self) {
        let Some(inner) = &self.inner else { return };
        let chunk = {
            let mut buffer = crate::lock(&inner.buffer);
            if buffer.is_empty() {
                return;
            }
            std::mem::take(&mut *buffer)
        };
        let _ = inner.tx.send(chunk).await;
    }

    /// Records handed to the sink so far.
    pub fn lines(&self) -> u64 {
        self.lines.load(Ordering::Relaxed)
    }
}

impl RecordWriter {
    /// Waits until every handed-over buffer is on disk. Call
    /// [`RecordSink::flush`] and drop every [`RecordSink`] clone first.
    /// Fails with what [`RecordWriter::failure`] says.
    pub async fn finish(mut self) -> Result<(), String> {
        match self.task.take() {
            None => Ok(()),
            Some(task) => match task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(self.failure.get().unwrap_or_default().to_string()),
                Err(err) => Err(format!("the writer of requests.jsonl failed: {err}")),
            },
        }
    }

    /// Where a failure to write the records is said (at once, while the run
    /// goes on).
    pub fn failure(&self) -> WriteFailure {
        self.failure.clone()
    }
}

/// Writes the record buffers into `file` at `path` as they come. Each
/// buffer holds whole lines; when one cannot be written whole (a full disk),
/// the file is cut back to its last whole line, so that it never ends in a
/// fragment, and the failure is said. A file whose directory was removed
/// or moved meanwhile (writes would go on into an unlinked file, lost at
/// the end) is a failure too.
fn write_chunks(
    mut file: impl RecordFile,
    path: &Path,
    mut rx: mpsc::Receiver<Vec<u8>>,
    failure: &WriteFailure,
) -> std::io::Result<()> {
    let mut written: u64 = 0;
    let fail = |err: std::io::Error, what: &str| {
        failure.fail(format!("cannot write {}: {what}{err}", path.display()));
        Err(err)
    };
    while let Some(chunk) = rx.blocking_recv() {
        if let Err(err) = file.still_at(path) {
            return fail(err, "");
        }
        let mut done = 0;
        while done < chunk.len() {
            match file.write(&chunk[done..]) {
                Ok(0) => {
                    done = usize::MAX;
                    break;
                }
                Ok(n) => done += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => {
                    // Keep the whole lines of this buffer that did reach
                    // the file, and nothing of the one cut short.
                    let whole = chunk[..done]
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |i| i + 1);
                    let kept = written + whole as u64;
                    let cut = file.cut_to(kept).map_or_else(
                        |e| format!(" (and cutting it back to its last whole record failed: {e})"),
                        |()| String::new(),
                    );
                    return fail(err, &format!("{kept} bytes of whole records kept{cut}; "));
                }
            }
        }
        if done == usize::MAX {
            return fail(std::io::ErrorKind::WriteZero.into(), "");
        }
        written += chunk.len() as u64;
    }
    file.flush()
}

/// The file the records go to (a trait so that tests can make it fail).
trait RecordFile: Write {
    /// Whether it is still the file at `path`.
    fn still_at(&self, path: &Path) -> std::io::Result<()>;
    /// Cuts it back to `len` bytes.
    fn cut_to(&mut self, len: u64) -> std::io::Result<()>;
}

impl RecordFile for std::fs::File {
    fn still_at(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let ours = self.metadata()?;
        match std::fs::metadata(path) {
            Ok(there) if there.dev() == ours.dev() && there.ino() == ours.ino() => Ok(()),
            Ok(_) => Err(std::io::Error::other(
                "another file took its place during the run",
            )),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(std::io::Error::other(
                "it was removed during the run (its directory deleted or moved): the records \
                 written since are lost",
            )),
            Err(err) => Err(err),
        }
    }

    fn cut_to(&mut self, len: u64) -> std::io::Result<()> {
        self.set_len(len)?;
        use std::io::Seek;
        self.seek(std::io::SeekFrom::Start(len)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that takes `room` bytes, then fails as a full disk does.
    struct FullAfter {
        bytes: Vec<u8>,
        room: usize,
    }

    impl Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room - self.bytes.len());
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
            }
            self.bytes.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl RecordFile for &mut FullAfter {
        fn still_at(&self, _: &Path) -> std::io::Result<()> {
            Ok(())
        }
        fn cut_to(&mut self, len: u64) -> std::io::Result<()> {
            self.bytes.truncate(len as usize);
            Ok(())
        }
    }

    /// A disk that fills in the middle of a buffer keeps every whole
    /// record written before, never a fragment, and the failure names the
    /// file and says what was kept.
    #[test]
    fn a_full_disk_keeps_whole_records_only() {
        let mut file = FullAfter {
            bytes: Vec::new(),
            room: 25,
        };
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(b"first\nsecond\n".to_vec()).unwrap();
        tx.try_send(b"third\nfourth\nfifth\n".to_vec()).unwrap();
        drop(tx);
        let failure = WriteFailure::default();
        let written = write_chunks(&mut file, Path::new("/run/requests.jsonl"), rx, &failure);
        assert_eq!(written.unwrap_err().raw_os_error(), Some(28));
        // 25 bytes reached the file, "fourth" without its end of line.
        assert_eq!(file.bytes, b"first\nsecond\nthird\n");
        assert_eq!(
            failure.get(),
            Some(
                "cannot write /run/requests.jsonl: 19 bytes of whole records kept; No space left on \
                 device (os error 28)"
            )
        );
    }

    /// An output directory removed during the run is said at the next
    /// write (the records would go into an unlinked file).
    #[tokio::test]
    async fn a_removed_output_directory_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let (sink, writer) = RecordSink::create(Some(&run)).unwrap();
        let failure = writer.failure();
        sink.send(RequestRecord::sample(Status::Ok)).await;
        sink.flush().await;
        std::fs::remove_dir_all(&run).unwrap();
        sink.send(RequestRecord::sample(Status::Ok)).await;
        sink.flush().await;
        let why = tokio::time::timeout(std::time::Duration::from_secs(10), failure.wait())
            .await
            .unwrap();
        assert!(why.contains("it was removed during the run"), "{why}");
        drop(sink);
        assert_eq!(writer.finish().await.unwrap_err(), why);
    }

    /// `cached_tokens` is written only when the server reported it, and a
    /// line without it (the server did not say, or an older file) reads
    /// back as None.
    #[test]
    fn cached_tokens_are_written_only_when_reported() {
        let unreported = RequestRecord::dropped(1, 1, 0, Phase::Measured, 0.0);
        let line = serde_json::to_string(&unreported).unwrap();
        assert!(!line.contains("cached_tokens"), "{line}");
        assert!(line.contains(r#""prompt_tokens":null"#), "{line}");
        let back: RequestRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, unreported);

        for cached in [0, 48] {
            let reported = RequestRecord {
                prompt_tokens: Some(80),
                cached_tokens: Some(cached),
                ..unreported.clone()
            };
            let line = serde_json::to_string(&reported).unwrap();
            assert!(
                line.contains(&format!(r#""cached_tokens":{cached}"#)),
                "{line}"
            );
            let back: RequestRecord = serde_json::from_str(&line).unwrap();
            assert_eq!(back.cached_tokens, Some(cached));
        }
        let null = line.replace(
            r#""prompt_tokens":null"#,
            r#""prompt_tokens":null,"cached_tokens":null"#,
        );
        let back: RequestRecord = serde_json::from_str(&null).unwrap();
        assert_eq!(back.cached_tokens, None);
    }
}
