//! Observability: per-worker metric shards merged at scrape time, request ids, log setup, the
//! access log.
//!
//! Ownership: each worker writes only its own metric shard (see `shared.rs`) and its own
//! access log buffer; nothing here locks on the request path, or allocates there (the access
//! log takes one buffer per batch of lines, not per request). `observe` is called, and calls
//! nothing else in the crate but number formatting.

pub mod access_log;
pub mod log;
pub mod metrics;
pub mod request_id;
