//! Nothing to call: this crate only asks for dependency features (see its
//! Cargo.toml), so that the binary's build and the test build compile the
//! shared dependencies once.
