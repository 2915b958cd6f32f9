//! Observability: per-worker metric shards merged at scrape time, request ids, log setup, the
//! access log.
//!
//! Ownership: each worker writes only its own shard (see `shared.rs`); nothing here locks or
//! allocates on the request path. `observe` is called and calls nothing else in the crate.

pub mod access_log;
pub mod log;
pub mod metrics;
pub mod request_id;
