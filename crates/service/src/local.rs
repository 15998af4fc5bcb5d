//! The local backend: each run a child process of the service on this
//! machine (a crash in one run cannot take the service down), in a process
//! group of its own so that a Ctrl-C meant for the service reaches no run.
//! A cancel is the child's own interrupt (SIGINT): it stops new requests,
//! drains those in flight and writes every completed record.

use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::launcher::{Job, Launcher};

/// A started run's process.
pub struct Started {
    pub child: tokio::process::Child,
    pub pid: u32,
}

/// Starts `job`, its stdout and stderr appended to `log`.
pub fn start(launcher: &dyn Launcher, job: Job<'_>, log: &Path) -> std::io::Result<Started> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    let mut command = launcher.run(job);
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the run's process exited before it was seen"))?;
    Ok(Started { child, pid })
}

/// Asks the process to drain and stop (SIGINT). False if it is gone.
pub fn interrupt(pid: u32) -> bool {
    signal(pid, Some(Signal::SIGINT))
}

/// Ends the process at once (SIGKILL), for one that outlived its drain.
pub fn kill_now(pid: u32) -> bool {
    signal(pid, Some(Signal::SIGKILL))
}

/// Whether process `pid` exists and is the run writing `dir` (a pid can
/// be reused by another process once the run's has ended).
pub fn is_run_alive(pid: u32, dir: &Path) -> bool {
    if !signal(pid, None) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let dir = dir.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|arg| arg == dir)
}

fn signal(pid: u32, signal: Option<Signal>) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    kill(Pid::from_raw(pid), signal).is_ok()
}
