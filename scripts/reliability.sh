#!/usr/bin/env bash
# Re-runs the figures of docs/RELIABILITY.md: seeded power cuts and kill -9 crash points
# against a writeback cache, the fault-injection suites, and a fuzzing run of the NBD
# handshake and request parser. Usage: scripts/reliability.sh [FUZZ_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
strata=target/release/strata
echo "== power cuts"
time "$strata" crashtest --points 1000 --seed 1 --mode powercut | tail -1
echo "== kill -9"
time "$strata" crashtest --points 200 --seed 1001 --mode kill | tail -1
echo "== fault injection"
cargo nextest run -p strata-io --test fault -p strata-cache --test faults -p strata-nbd --test hostile
echo "== fuzzing"
fuzz/run.sh "${1:-600}"
