//! Log setup: tracing to stderr, filtered by `RUST_LOG` when set, else by the config's
//! `log_level`.

/// Installs the global subscriber once; later calls (tests start many servers) do nothing.
pub fn init(default_level: &str) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => tracing_subscriber::EnvFilter::new(v),
        _ => tracing_subscriber::EnvFilter::new(default_level),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
