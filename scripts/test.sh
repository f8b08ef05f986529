#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo nextest run --workspace --no-fail-fast "$@"
