#!/usr/bin/env bash
# The soak of docs/RELIABILITY.md: MINUTES (default 30) of rate-limited mixed fio load plus
# the crash oracle's workload on a writeback cache served by `strata serve`, killed with
# SIGKILL at random moments and restarted, every restart verified. A benchmark-style run,
# not part of CI; it runs at the lowest CPU priority. Usage: scripts/soak.sh [MINUTES] [RATE_IOPS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The soak restarts the server from its own executable: run a copy, so that a rebuild while
# it runs changes nothing.
bin=$(mktemp -d /var/tmp/strata-soak-bin.XXXXXX)
trap 'rm -rf "$bin"' EXIT
cp "${CARGO_TARGET_DIR:-target}/release/strata" "$bin/strata"
time nice -n 19 "$bin/strata" crashtest --mode soak --minutes "${1:-30}" --rate-iops "${2:-1500}" --seed 1 \
  --dir /var/tmp/strata-crashtest
