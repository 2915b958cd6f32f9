#!/usr/bin/env bash
# The whole test suite, twice: on the io_uring driver, then on the epoll fallback
# (MONOIO_FORCE_LEGACY_DRIVER=1), as both must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== tests on the io_uring driver"
cargo test --locked "$@"
echo "== tests on the epoll fallback driver"
MONOIO_FORCE_LEGACY_DRIVER=1 cargo test --locked "$@"
