#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# A one-off build keeps no incremental state: it would double the disk it needs.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo nextest run --workspace --no-fail-fast "$@"
