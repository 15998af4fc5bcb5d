//! A run as library calls, under every way to start one (`nyann-bench
//! generate`, `demo`, `eval`, a fleet's processes, a service, a test):
//! a typed specification ([`RunSpec`]) and the steps that run it, each a
//! call that the caller can put its own words and display between.
//!
//! 1. [`Run::prepare`]: everything that can fail before load is sent (a
//!    run the output directory holds already, the policy, the signal
//!    source and its preflight, the fleet's coordination endpoint).
//! 2. [`Prepared::execute`]: the load, with its live figures readable
//!    meanwhile ([`Prepared::live`]): alone, or as a fleet's leader with
//!    its workers ([`LeadSpec`]).
//! 3. [`Executed::finish`]: the conclusion, `summary.json` with it, and
//!    the HTML report in the run directory.
//!
//! A fleet's other workers take [`fleet::Worker`]'s steps instead: join
//! the leader, run the share it hands out, upload the records.
//!
//! Nothing here writes to the terminal or names a command-line flag: the
//! caller words the errors ([`PrepareError`], [`ExecuteError`]) and the
//! [`Notice`]s for its users, and stops a run through its [`Stop`].

mod execute;
mod finish;
pub mod fleet;
mod prepare;
mod spec;
mod stop;

pub use execute::{ExecuteError, Executed};
pub use finish::{Finished, Report, exit_code};
pub use prepare::{Notice, PrepareError, Prepared, PreviousRun, Run};
pub use spec::{LeadSpec, Output, PolicySource, PolicySpec, RegistrySource, RunSpec};
pub use stop::Stop;
