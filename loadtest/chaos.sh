#!/usr/bin/env bash
# Chaos run: 3 origins, wrk -c64 for 30 s, one origin killed at 10 s and restarted at 20 s.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 loadtest/chaos.py "$@"
