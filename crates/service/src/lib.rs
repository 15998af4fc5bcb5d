//! A run service (`nyann-bench serve`): clients name an operator-defined
//! target and give a Starlark scenario; the service plans it in a bounded
//! child process, checks it against the target's bounds and signal source,
//! queues it (one run at a time per target, a bound overall), runs each as
//! a child process or a Job in a cluster writing an ordinary run
//! directory, and keeps every run's state in SQLite across restarts.
//!
//! - [`targets`]: the operator's targets file, validated at start.
//! - [`plan`]: a scenario compiled and checked against its target;
//!   [`preflight`] its signal source asked whether it can judge.
//! - [`store`]: the runs' state.
//! - [`service`]: the domain core and its scheduler; its backends:
//!   [`local`] (child processes) and [`kubernetes`] (Jobs in a cluster).
//! - [`auth`]: bearer tokens with scopes.
//! - [`http`]: the JSON API and the web page over the core; [`mcp`] the
//!   MCP tools, mounted among its routes; [`report`] a run's report in
//!   brief.
//!
//! Nothing here names a command-line flag: the binary resolves its flags
//! into a [`Config`] and gives the commands of its child processes through
//! a [`Launcher`].

pub mod auth;
pub mod http;
pub mod kubernetes;
pub mod launcher;
pub mod local;
pub mod mcp;
pub mod plan;
pub mod preflight;
pub mod report;
pub mod service;
pub mod store;
pub mod targets;

pub use kubernetes::ClusterSettings;
pub use launcher::{Job, Launcher};
pub use service::{Config, Service};
pub use targets::{Target, Targets};
