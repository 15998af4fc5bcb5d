//! The policy host's integration tests, in one binary (wasmtime makes
//! every test binary slow to link). Guests are real components: the
//! embedded built-in, the example policies and a hostile policy, built for
//! wasm32-wasip2 on first use, plus hand-written WAT and raw bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod builtin;
mod cache;
mod common;
mod examples;
mod sandbox;
