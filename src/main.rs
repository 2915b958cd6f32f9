//! The `ringway` binary: arguments → config → server; no logic of its own.

use std::process::ExitCode;

use ringway::cli::{self, Command, USAGE};
use ringway::config::{self, Generation};
use ringway::{control, observe, Server};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let command = match cli::parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringway: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Version => {
            println!("ringway {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Help => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Command::Check { config } => match config::load(&config) {
            Ok(gen) => {
                match control::resolve_all(&gen, &ringway::shared::StateBook::new(None, 1)) {
                    Ok(endpoints) => {
                        print!("{}", config::describe(&gen, Some(&endpoints)));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", gen.source);
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => match config::load(&config) {
            Ok(gen) => run(gen),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Proxy {
            listen,
            upstreams,
            workers,
        } => match config::quick_proxy(&listen, &upstreams, workers) {
            Ok(gen) => run(gen),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run(gen: Generation) -> ExitCode {
    observe::log::init(&gen.log_level);
    let source = gen.source.clone();
    let server = match Server::start(gen) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringway: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(config = %source, "serving; SIGHUP reloads, SIGTERM or SIGINT drains and stops");
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringway: cannot install signal handlers: {e}");
            server.shutdown();
            server.join();
            return ExitCode::FAILURE;
        }
    };
    let handle = server.shutdown_handle();
    let reload = server.reload_handle();
    let _ = std::thread::Builder::new()
        .name("ringway-signals".into())
        .spawn(move || {
            let mut first = true;
            for sig in signals.forever() {
                if sig == signal_hook::consts::SIGHUP {
                    tracing::info!("SIGHUP: reloading the config");
                    reload.reload();
                } else if first {
                    tracing::info!(signal = sig, "shutting down: draining in-flight requests");
                    handle.shutdown();
                    first = false;
                } else {
                    tracing::warn!(signal = sig, "second signal: exiting now");
                    std::process::exit(1);
                }
            }
        });
    server.join();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
