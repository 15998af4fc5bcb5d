//! End-to-end tests: the real `nyann-bench` binary against the simulator, a
//! real Prometheus and real policy components. One test binary (as wasmtime
//! does) keeps link time down; each area is a module.

mod cli;
