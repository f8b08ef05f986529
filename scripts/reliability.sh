#!/usr/bin/env bash
# Re-runs the figures of docs/RELIABILITY.md: seeded power cuts and kill -9 crash points
# against a writeback cache, a write log and a thin volume with snapshots, an ext4 workload
# cut at every flush point on a plain volume, a cache and a write log (needs root, FUSE and
# loop devices), the fault matrix and the fault-injection suites, and a fuzzing run of the
# NBD handshake and request parser. The 30-minute soak is separate: scripts/soak.sh.
# Usage: scripts/reliability.sh [FUZZ_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
strata=${CARGO_TARGET_DIR:-target}/release/strata
echo "== power cuts"
time "$strata" crashtest --mode powercut --cache-mode all --clients 4 --points 1000 --seed 1000 | tail -8
echo "== kill -9"
time "$strata" crashtest --points 200 --seed 1001 --mode kill | tail -1
echo "== the write log: power cuts and kill -9"
time "$strata" crashtest --mode powercut --target writecache --cache-mode all --clients 4 --points 350 --seed 1000 | tail -4
time "$strata" crashtest --mode kill --target writecache --points 250 --seed 7000 | tail -1
echo "== thin volumes and snapshots: power cuts and kill -9"
time "$strata" crashtest --mode powercut --target thin --clients 4 --points 500 --seed 1 | tail -4
time "$strata" crashtest --mode kill --target thin --points 250 --seed 1 | tail -1
echo "== ext4 cut at every flush point (plain volume, writeback cache, write log)"
time "$strata" crashtest --points 0 --seed 1 --mode ext4 | tail -1
echo "== fault matrix"
for t in cache writecache thin; do
    time "$strata" crashtest --seed 1 --mode faults --target "$t" | tail -1
done
echo "== fault injection"
cargo nextest run -p strata-io --test fault -p strata-cache --test faults -p strata-nbd --test hostile -p strata --test fault_spec
echo "== fuzzing"
fuzz/run.sh "${1:-600}"
