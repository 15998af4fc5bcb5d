//! Server metric sources (Prometheus range API, direct /metrics scraping) to per-role stage signals
