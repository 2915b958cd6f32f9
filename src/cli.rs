//! Command-line parsing (no logic beyond turning arguments into a [`Command`]).

use std::path::PathBuf;

use crate::config::DEFAULT_CONFIG_PATH;

/// Usage text.
pub const USAGE: &str = "\
usage:
  ringway [run] [--config PATH]       serve with a config file (default config/ringway.toml)
  ringway check [--config PATH]       validate a config and print what it compiles to
  ringway proxy --listen ADDR --upstream ADDR[,ADDR...] [--workers N]
                                      forward every path to the upstreams, default settings
  ringway --version | --help";

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Serve with a config file.
    Run {
        /// Config path.
        config: PathBuf,
    },
    /// Validate a config file.
    Check {
        /// Config path.
        config: PathBuf,
    },
    /// Quick reverse proxy without a config file.
    Proxy {
        /// Listen address.
        listen: String,
        /// Upstream endpoints.
        upstreams: Vec<String>,
        /// Worker count, if given.
        workers: Option<usize>,
    },
    /// Print the version.
    Version,
    /// Print usage.
    Help,
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut args = args.into_iter().peekable();
    let sub = match args.peek().map(String::as_str) {
        Some("run") | Some("check") | Some("proxy") => args.next(),
        _ => None,
    };
    let mut config = None;
    let mut listen = None;
    let mut upstreams = Vec::new();
    let mut workers = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-V" | "--version" => return Ok(Command::Version),
            "-h" | "--help" => return Ok(Command::Help),
            "-c" | "--config" => config = Some(PathBuf::from(value("--config")?)),
            "--listen" => listen = Some(value("--listen")?),
            "--upstream" => upstreams.extend(
                value("--upstream")?
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            ),
            "--workers" => {
                let v = value("--workers")?;
                workers = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("--workers takes a positive number, not `{v}`"))?,
                );
            }
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    let config_or_default =
        |c: Option<PathBuf>| c.unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    match sub.as_deref() {
        Some("proxy") => {
            if config.is_some() {
                return Err("proxy does not take --config".into());
            }
            let listen = listen.ok_or("proxy needs --listen ADDR")?;
            if upstreams.is_empty() {
                return Err("proxy needs --upstream ADDR[,ADDR...]".into());
            }
            Ok(Command::Proxy {
                listen,
                upstreams,
                workers,
            })
        }
        _ if listen.is_some() || !upstreams.is_empty() || workers.is_some() => {
            Err("--listen, --upstream and --workers go with `ringway proxy`".into())
        }
        Some("check") => Ok(Command::Check {
            config: config_or_default(config),
        }),
        _ => Ok(Command::Run {
            config: config_or_default(config),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn commands() {
        assert_eq!(
            p(&[]),
            Ok(Command::Run {
                config: PathBuf::from(DEFAULT_CONFIG_PATH)
            })
        );
        assert_eq!(
            p(&["--config", "x.toml"]),
            Ok(Command::Run {
                config: PathBuf::from("x.toml")
            })
        );
        assert_eq!(
            p(&["check", "-c", "y.toml"]),
            Ok(Command::Check {
                config: PathBuf::from("y.toml")
            })
        );
        assert_eq!(
            p(&[
                "proxy",
                "--listen",
                "127.0.0.1:1",
                "--upstream",
                "a:1, b:2",
                "--workers",
                "2"
            ]),
            Ok(Command::Proxy {
                listen: "127.0.0.1:1".into(),
                upstreams: vec!["a:1".into(), "b:2".into()],
                workers: Some(2)
            })
        );
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert!(p(&["proxy", "--listen", "x"]).is_err());
        assert!(p(&["--bogus"]).is_err());
        assert!(p(&["--config"]).is_err());
        assert!(p(&["--listen", "x"]).is_err());
        assert!(p(&[
            "proxy",
            "--listen",
            "a",
            "--upstream",
            "b",
            "--workers",
            "0"
        ])
        .is_err());
    }
}
