//! ringway: an io_uring, thread-per-core HTTP reverse proxy and API-gateway dataplane.
//!
//! Request path (HTTP/1.1): a worker accepts on its own SO_REUSEPORT socket, a task per
//! connection reads and parses the head (`http1`), answers reserved paths, routes (`route`), and
//! either answers locally or forwards (`proxy`) over a pooled upstream connection (`upstream`),
//! streaming both bodies through pooled blocks (`buf`). Errors are classified once (`error`).
//!
//! Thread model: one pinned worker thread per core, each with its own monoio runtime (io_uring,
//! epoll fallback) and all its state in `Rc`/`Cell`; a control thread does everything slow
//! (DNS, reloads, shutdown) and a writer thread appends the access log (`observe::access_log`);
//! the only cross-core state is `shared`.
//!
//! Modules, in data-flow order:

#![warn(missing_docs)]

pub mod buf;
pub mod cli;
pub mod config;
pub mod control;
pub mod error;
pub mod h2;
pub mod http1;
pub mod net;
pub mod observe;
pub mod proxy;
pub mod route;
pub mod server;
pub mod shared;
pub mod tls;
pub mod upstream;
pub mod worker;

pub use server::{ReloadHandle, Server, ShutdownHandle, StartError};

#[doc(hidden)]
pub mod fuzzing;
#[cfg(test)]
pub(crate) mod testing;
