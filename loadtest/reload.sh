#!/usr/bin/env bash
# Reload under load: wrk -c64 while the config is rewritten and reloaded 20 times.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 loadtest/reload.py "$@"
