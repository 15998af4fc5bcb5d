//! End-to-end tests: the real `nyann-bench` binary against the simulator, a
//! real Prometheus and real policy components. One test binary (as wasmtime
//! does) keeps link time down; each area is a module.
//!
//! Sweeps run one at a time (see `support::serial`): on a 2-core machine two
//! concurrent sweeps would compete with each other's simulator for CPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod abuse;
mod browser;
mod cache;
mod cli;
mod evals;
mod failures;
mod fleet;
mod goodput;
mod kube;
mod oci;
mod policy;
mod polyglot;
mod report;
mod serve;
mod sharegpt;
mod signals;
mod support;
mod sweep;
mod twin;
