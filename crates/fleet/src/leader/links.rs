//! A worker's link, one task per connection: heartbeats both ways, loss
//! detection, and receiving the worker's records upload (stored under a
//! name no worker writes, or read in place from a shared directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::merge::{RecordsFile, WorkerRun};
use crate::protocol::{ToLeader, ToWorker, receive, write_task};
use crate::{UPLOADED_RECORDS, lock, worker_dir};

use super::{Event, Fleet};

/// What every link task needs.
pub(super) struct Links {
    pub(super) fleet: Arc<Fleet>,
    pub(super) events: mpsc::Sender<Event>,
    pub(super) timeout: Duration,
    pub(super) output_dir: PathBuf,
}

impl Links {
    /// Starts the tasks of a worker's connection (`rejoined`: one opened
    /// to retry an upload, which takes no part in the stages).
    pub(super) fn open(
        &self,
        worker: usize,
        read: BufReader<OwnedReadHalf>,
        write: OwnedWriteHalf,
        rejoined: bool,
    ) {
        let (to_worker, outgoing) = mpsc::channel(64);
        if !rejoined {
            lock(&self.fleet.senders).insert(worker, to_worker.clone());
        }
        tokio::spawn(write_task(write, outgoing, self.timeout / 4));
        tokio::spawn(read_task(Link {
            worker,
            read,
            reply: to_worker,
            events: self.events.clone(),
            fleet: self.fleet.clone(),
            timeout: self.timeout,
            dir: worker_dir(&self.output_dir, worker),
            rejoined,
        }));
    }
}

/// One worker's connection, read by its link task.
pub(super) struct Link {
    worker: usize,
    read: BufReader<OwnedReadHalf>,
    /// Its write queue (for the upload receipt).
    reply: mpsc::Sender<ToWorker>,
    events: mpsc::Sender<Event>,
    fleet: Arc<Fleet>,
    timeout: Duration,
    /// `worker-I/` in the leader's results directory.
    dir: PathBuf,
    /// Opened to retry an upload.
    rejoined: bool,
}

/// Time allowed for a records upload (beyond the heartbeat timeout).
pub(super) const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);

pub(super) async fn read_task(mut link: Link) {
    let worker = link.worker;
    // After an upload attempt (or on a rejoined link) a closed connection
    // is that upload's failure, not a lost worker: its stages are over.
    let mut uploading = link.rejoined;
    // The last attempt was answered `UploadFailed`: a connection closed
    // now is the worker giving up, not a retry to wait for.
    let mut refused = false;
    let mut left = false;
    let ended = loop {
        let message = match tokio::time::timeout(
            link.timeout,
            receive::<_, ToLeader>(&mut link.read),
        )
        .await
        {
            Err(_) => break format!("no message for {:?} (heartbeat timeout)", link.timeout),
            Ok(Err(err)) => break err.to_string(),
            Ok(Ok(message)) => message,
        };
        let event = match message {
            ToLeader::Heartbeat | ToLeader::Join { .. } | ToLeader::Rejoin { .. } => continue,
            ToLeader::Ready { stage } => Event::Ready { worker, stage },
            ToLeader::Stats { stage, stats } => Event::Stats {
                worker,
                stage,
                stats,
            },
            ToLeader::Leaving { reason } => {
                if !left && !uploading {
                    left = true;
                    link.fleet.depart(worker, reason, true);
                }
                Event::Gone {
                    worker,
                    connected: true,
                }
            }
            ToLeader::Upload {
                result,
                decision_waits,
                records_bytes,
                shared,
            } => {
                uploading = true;
                refused = false;
                let stored = tokio::time::timeout(
                    UPLOAD_TIMEOUT,
                    receive_records(&mut link.read, &link.dir, records_bytes, shared),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Link(format!(
                        "the records did not arrive within {UPLOAD_TIMEOUT:?}"
                    )))
                });
                match stored {
                    Ok(records) => {
                        lock(&link.fleet.uploaded).insert(worker);
                        lock(&link.fleet.senders).remove(&worker);
                        let _ = link.reply.send(ToWorker::Received).await;
                        let _ = link
                            .events
                            .send(Event::Uploaded(Box::new(WorkerRun {
                                worker,
                                result: *result,
                                records: Some(records),
                                records_error: None,
                                decision_waits,
                            })))
                            .await;
                        return;
                    }
                    Err(StoreError::Local(reason)) => {
                        refused = true;
                        tracing::warn!("worker {worker}: its records upload failed: {reason}");
                        let _ = link
                            .reply
                            .send(ToWorker::UploadFailed {
                                reason: reason.clone(),
                            })
                            .await;
                        Event::UploadFailed {
                            worker,
                            result,
                            decision_waits,
                            reason,
                        }
                    }
                    Err(StoreError::Link(reason)) => {
                        tracing::warn!("worker {worker}: its records upload failed: {reason}");
                        let _ = link
                            .events
                            .send(Event::UploadFailed {
                                worker,
                                result,
                                decision_waits,
                                reason: reason.clone(),
                            })
                            .await;
                        break reason;
                    }
                }
            }
        };
        if link.events.send(event).await.is_err() {
            return;
        }
    };
    let event = if uploading && !refused {
        tracing::debug!("worker {worker}: its connection ended after an upload attempt: {ended}");
        Event::LinkEnded { worker }
    } else if uploading {
        // It gave up after its attempts: nothing more will come.
        Event::Gone {
            worker,
            connected: false,
        }
    } else {
        if !left {
            link.fleet.depart(worker, ended, false);
        }
        Event::Gone {
            worker,
            connected: false,
        }
    };
    let _ = link.events.send(event).await;
}

/// Why records did not arrive.
pub(super) enum StoreError {
    /// On the leader's side (its disk, the shared file): the link is fine.
    Local(String),
    /// The connection broke.
    Link(String),
}

/// Receives `bytes` of records: from the worker's own file in a shared
/// directory, or from the connection into `worker-I/requests.uploaded.jsonl`
/// (written under a temporary name first, so that a failed attempt leaves
/// no partial file behind). A local failure reads the rest of the bytes,
/// so that the link stays usable for the next attempt.
pub(super) async fn receive_records(
    read: &mut BufReader<OwnedReadHalf>,
    dir: &Path,
    bytes: u64,
    shared: bool,
) -> Result<RecordsFile, StoreError> {
    if shared {
        let path = dir.join(nyann_results::REQUESTS);
        let found = tokio::fs::metadata(&path)
            .await
            .map_err(|err| StoreError::Local(format!("cannot read {}: {err}", path.display())))?
            .len();
        if found < bytes {
            return Err(StoreError::Local(format!(
                "{} holds {found} of the {bytes} bytes the worker wrote",
                path.display()
            )));
        }
        return Ok(RecordsFile { path, bytes });
    }
    let path = dir.join(UPLOADED_RECORDS);
    let partial = dir.join(format!("{UPLOADED_RECORDS}.partial"));
    let mut remaining = bytes;
    let local_error = match create(dir, &partial).await {
        Err(err) => Some(format!("cannot write {}: {err}", partial.display())),
        Ok(mut file) => {
            let mut buf = vec![0u8; 64 << 10];
            let mut failed = None;
            while remaining > 0 {
                let want = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
                let n = read.read(&mut buf[..want]).await.map_err(|err| {
                    StoreError::Link(format!(
                        "{} of {bytes} bytes arrived: {err}",
                        bytes - remaining
                    ))
                })?;
                if n == 0 {
                    return Err(StoreError::Link(format!(
                        "{} of {bytes} bytes arrived: the connection closed",
                        bytes - remaining
                    )));
                }
                remaining -= n as u64;
                if let Err(err) = file.write_all(&buf[..n]).await {
                    failed = Some(format!("cannot write {}: {err}", partial.display()));
                    break;
                }
            }
            match failed {
                Some(err) => Some(err),
                None => match file.sync_all().await {
                    Err(err) => Some(format!("cannot write {}: {err}", partial.display())),
                    Ok(()) => tokio::fs::rename(&partial, &path)
                        .await
                        .err()
                        .map(|err| format!("cannot rename {}: {err}", partial.display())),
                },
            }
        }
    };
    match local_error {
        None => Ok(RecordsFile { path, bytes }),
        Some(reason) => {
            let _ = tokio::fs::remove_file(&partial).await;
            let drained = tokio::io::copy(&mut read.take(remaining), &mut tokio::io::sink())
                .await
                .map_err(|err| StoreError::Link(err.to_string()))?;
            if drained < remaining {
                return Err(StoreError::Link(format!(
                    "{reason}; then the connection closed"
                )));
            }
            Err(StoreError::Local(reason))
        }
    }
}

pub(super) async fn create(dir: &Path, path: &Path) -> std::io::Result<tokio::fs::File> {
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::File::create(path).await
}
