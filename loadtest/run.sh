#!/usr/bin/env bash
# ringway vs nginx vs HAProxy, one interleaved run; see loadtest/README.md.
#   loadtest/run.sh            every scenario (about 10 minutes)
#   loadtest/run.sh --quick    small body at 64 connections and 1 MiB (under 2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 loadtest/run.py "$@"
