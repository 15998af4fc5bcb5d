//! Human-readable reports of a run: the stage table printed on stderr at the
//! end of `generate` (the JSON summary on stdout is `RunResult` itself), and
//! the self-contained HTML report (`report.html`) built from the files a run
//! saved in its output directory.
//!
//! The HTML report's data flow: [`saved`] reads a results directory
//! (summary, scenario, requests) into a [`saved::SavedRun`], binning the
//! per-request records into a [`timeline::Timeline`]; [`charts`] draws SVG
//! charts from those (plotters); [`html`] assembles one page.

pub mod charts;
pub mod html;
pub mod saved;
mod table;
pub mod timeline;

pub use table::{outcome_line, stage_table};
