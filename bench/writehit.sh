#!/usr/bin/env bash
# Write hits on clean cached blocks, two strata binaries compared in one run (rounds
# alternate): origin 256 MiB and cache 512 MiB as files under $DIR, 64 KiB blocks, policy lru;
# the volume is read once so every block is cached clean, then fio --ioengine=nbd randwrite
# 4 KiB at iodepth 16 for 15 s, in writeback and in writethrough.
# Usage: bench/writehit.sh OLD_BIN NEW_BIN [ROUNDS]   (docs/BENCHMARKS.md, "What the durability rules cost")
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
W=${DIR:-/var/tmp/strata-writehit}
rm -rf "$W"; mkdir -p "$W"
run() { # BIN MODE TAG
  local bin=$1 mode=$2 tag=$3
  rm -f "$W"/o.img "$W"/c.img "$W"/s.sock
  "$bin" cache create --origin "$W/o.img?size=256MiB" --cache "$W/c.img?size=512MiB" --mode "$mode" \
     --migration-budget 0 --sequential-cutoff 0 --writeback-percent 100 --policy lru >/dev/null
  "$bin" serve --unix "$W/s.sock" vol=cache:"$W/c.img" > "$W/serve.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -S "$W/s.sock" ] && break; sleep 0.05; done
  local uri="nbd+unix:///vol?socket=$W/s.sock"
  fio --name=warm --ioengine=nbd --uri="$uri" --rw=read --bs=1m --size=256m --output=/dev/null
  sleep 1
  fio --name=w --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 --size=256m \
     --time_based --runtime=15 --norandommap --randrepeat=1 --output-format=json > "$W/$tag.json"
  kill -TERM $pid; wait $pid || true
  python3 - "$W/$tag.json" "$tag" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
w = json.loads(t[t.index('{'):])['jobs'][0]['write']
p = w['clat_ns']['percentile']
print(sys.argv[2], round(w['iops']), 'IOPS, p50', p['50.000000'] // 1000, 'us, p99', p['99.000000'] // 1000, 'us')
PY
}
for round in $(seq "$rounds"); do
  for mode in writeback writethrough; do
    run "$old" $mode old-$mode-$round
    run "$new" $mode new-$mode-$round
  done
done
rm -rf "$W"
