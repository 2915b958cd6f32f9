//! Sockets: listener groups (probe-bind, then one SO_REUSEPORT socket per worker), the dialer,
//! and the few raw syscalls ringway makes itself (`sys.rs`).
//!
//! Ownership: listener sockets are created on the starting thread and handed to workers, each
//! worker owning its own. Nothing here resolves names: the dialer takes a `SocketAddr`.

pub mod client;
pub mod dialer;
pub mod listener;
pub mod sys;

pub use dialer::connect;
pub use listener::{bind_group, BindError, ListenerGroup};
