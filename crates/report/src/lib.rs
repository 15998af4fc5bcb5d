//! Human-readable reports of a run: the stage table printed on stderr at the
//! end of a sweep (the JSON summary on stdout is the run's result itself),
//! and the self-contained HTML report (`report.html`) built from the files a
//! run saved in its run directory.
//!
//! The HTML report's data flow: [`saved`] reads a run directory (summary,
//! scenario, requests) into a [`SavedRun`], binning the per-request records
//! into a [`timeline::Timeline`]; [`charts`] draws SVG charts from those
//! (plotters); [`html`] assembles one page; [`write_html`] saves it.

pub mod charts;
mod goodput;
pub mod html;
pub mod saved;
mod table;
pub mod timeline;

use std::path::{Path, PathBuf};

pub use saved::SavedRun;
pub use table::{outcome_line, stage_table};

/// Why a report could not be built or written. A cause is said once:
/// either in the message or as the `source` (which `main` prints after
/// it), never both.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Read(#[from] nyann_results::ReadError),
    /// Its message names `requests.jsonl` and the cause.
    #[error(transparent)]
    Records(nyann_results::RecordError),
    /// plotters' error, as text (its type is generic over the backend).
    #[error("drawing a chart: {0}")]
    Chart(String),
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Writes the HTML report of `runs` (at least one) to `path`; returns its
/// size in bytes.
pub fn write_html(runs: &[SavedRun], path: &Path) -> Result<usize, ReportError> {
    let page = html::page(runs)?;
    std::fs::write(path, &page).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(page.len())
}
