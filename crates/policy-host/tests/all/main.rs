//! The policy host's integration tests, in one binary (wasmtime makes
//! every test binary slow to link). Guests are real components: the
//! embedded built-in, the example policies, a hostile policy and a policy
//! built against the frozen 0.1 WIT, built for wasm32-wasip2 on first use;
//! components assembled without a compiler (`nyann_guests::assembled`);
//! hand-written WAT and raw bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod builtin;
mod cache;
mod common;
mod examples;
mod sandbox;
mod versions;
