//! The control thread: everything slow, off the workers. Resolves upstream names at start and
//! every [`DNS_REFRESH`] after, publishing changes through `shared.rs`; keeps the last answer
//! when a lookup fails (RFC 8767: serve stale).
//!
//! Ownership: runs on its own std thread; talks to workers only through `Shared`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{EndpointSpec, Generation};
use crate::shared::{EndpointTable, ResolvedEndpoint, Shared};

/// How often endpoint names are resolved again.
pub const DNS_REFRESH: Duration = Duration::from_secs(10);

/// How often the control loop wakes to check for work.
const CONTROL_TICK: Duration = Duration::from_millis(50);

/// Resolves one endpoint spec (blocking: control thread or start-up only).
#[allow(clippy::disallowed_methods)] // the control thread may block on DNS; workers never do
fn resolve_spec(spec: &EndpointSpec) -> Result<Vec<SocketAddr>, String> {
    if let Some(addr) = spec.literal {
        return Ok(vec![addr]);
    }
    let mut addrs: Vec<SocketAddr> = (spec.host.as_str(), spec.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve `{}`: {e}", spec.authority))?
        .collect();
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err(format!("`{}` resolves to no address", spec.authority));
    }
    Ok(addrs)
}

/// Resolves every endpoint of every upstream; fails on the first name that does not resolve.
pub fn resolve_all(gen: &Generation) -> Result<EndpointTable, String> {
    let mut table = Vec::with_capacity(gen.upstreams.len());
    for up in &gen.upstreams {
        let mut eps = Vec::new();
        for spec in &up.endpoints {
            let authority: Arc<str> = Arc::from(spec.authority.as_str());
            for addr in resolve_spec(spec).map_err(|e| format!("upstream `{}`: {e}", up.name))? {
                eps.push(ResolvedEndpoint {
                    addr,
                    authority: authority.clone(),
                });
            }
        }
        table.push(eps);
    }
    Ok(table)
}

/// Re-resolves names, keeping the previous addresses of a spec whose lookup fails.
fn refresh(gen: &Generation, previous: &EndpointTable) -> EndpointTable {
    let mut table = Vec::with_capacity(gen.upstreams.len());
    for (i, up) in gen.upstreams.iter().enumerate() {
        let mut eps = Vec::new();
        for spec in &up.endpoints {
            let authority: Arc<str> = Arc::from(spec.authority.as_str());
            match resolve_spec(spec) {
                Ok(addrs) => eps.extend(addrs.into_iter().map(|addr| ResolvedEndpoint {
                    addr,
                    authority: authority.clone(),
                })),
                Err(e) => {
                    tracing::warn!(upstream = %up.name, error = %e, "DNS refresh failed; keeping the last answer");
                    if let Some(prev) = previous.get(i) {
                        eps.extend(
                            prev.iter()
                                .filter(|p| *p.authority == *spec.authority)
                                .cloned(),
                        );
                    }
                }
            }
        }
        table.push(eps);
    }
    table
}

/// The control loop; returns when `stop` is set.
pub fn run(shared: Arc<Shared>, gen: Arc<Generation>, stop: Arc<AtomicBool>) {
    let has_names = gen
        .upstreams
        .iter()
        .any(|u| u.endpoints.iter().any(|e| e.literal.is_none()));
    let mut next_dns = Instant::now() + DNS_REFRESH;
    while !stop.load(Ordering::Acquire) {
        #[allow(clippy::disallowed_methods)] // control thread, not a worker
        std::thread::sleep(CONTROL_TICK);
        if has_names && Instant::now() >= next_dns && !shared.is_draining() {
            next_dns = Instant::now() + DNS_REFRESH;
            let previous = shared.endpoints.load_full();
            let table = refresh(&gen, &previous);
            if *previous != table {
                tracing::info!("upstream endpoints changed after DNS refresh");
                shared.publish_endpoints(table);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_localhost_resolve() {
        let gen = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"127.0.0.1:9\", \"localhost:80\"]\n",
            "t",
        )
        .unwrap();
        let table = resolve_all(&gen).unwrap();
        assert!(table[0].len() >= 2);
        assert_eq!(table[0][0].addr, "127.0.0.1:9".parse().unwrap());
        assert!(table[0].iter().any(|e| &*e.authority == "localhost:80"));
        let again = refresh(&gen, &table);
        assert_eq!(again, table);
    }

    #[test]
    fn unresolvable_name_is_an_error_at_start_and_stale_after() {
        let gen = crate::config::compile(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[upstreams]]\nname = \"a\"\nendpoints = [\"no-such-host.invalid:80\"]\n",
            "t",
        )
        .unwrap();
        assert!(resolve_all(&gen)
            .unwrap_err()
            .contains("no-such-host.invalid"));
        let previous = vec![vec![ResolvedEndpoint {
            addr: "10.0.0.1:80".parse().unwrap(),
            authority: Arc::from("no-such-host.invalid:80"),
        }]];
        assert_eq!(refresh(&gen, &previous), previous);
    }
}
