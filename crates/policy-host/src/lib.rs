//! The wasmtime host that loads congestion policy components and calls describe/validate/judge in a sandbox
