#!/usr/bin/env bash
# Fuzzes the NBD server (target nbd_session) for SECONDS (default 300), then prints the run
# time, executions per second and the crashes found, with the panic of each crash.
#
# Usage: fuzz/run.sh [SECONDS] [--minimize]
#   --minimize   afterwards, rebuild corpus/nbd_session as the generated seeds plus a
#                set-cover merge of it and everything this run found (what to commit)
# Environment: FUZZ_SANITIZER=address|none (default address; none runs several times faster)
#
# Installs cargo-fuzz if it is missing. cargo-fuzz passes nightly-only flags to rustc
# (-Zsanitizer and friends); RUSTC_BOOTSTRAP=1 lets a stable toolchain accept them.
# New corpus entries go to work/ (ignored by git), never straight into corpus/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
secs=300
minimize=false
for arg in "$@"; do
    case "$arg" in
        --minimize) minimize=true ;;
        ''|*[!0-9]*) echo "usage: $0 [SECONDS] [--minimize]" >&2; exit 2 ;;
        *) secs=$arg ;;
    esac
done
sanitizer=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

cd "$here"
target=nbd_session
work=work/$target
artifacts=artifacts/$target
mkdir -p "$work" "$artifacts"
log=work/$target.log

echo "== building $target (sanitizer: $sanitizer)"
cargo fuzz build --sanitizer "$sanitizer" "$target"

before=$(ls "$artifacts" | sort)
echo "== fuzzing $target for ${secs}s (log: fuzz/$log)"
start=$(date +%s.%N)
set +e
# close_fd_mask=2 silences the server's per-connection log lines (libFuzzer keeps its own
# output); a crash's panic message is printed below by rerunning the crashing input.
cargo fuzz run --sanitizer "$sanitizer" "$target" "$work" "corpus/$target" -- \
    -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -dict=nbd_session.dict \
    -print_final_stats=1 -close_fd_mask=2 >"$log" 2>&1
status=$?
set -e
end=$(date +%s.%N)

stat() { grep -o "stat::$1: *[0-9]*" "$log" | grep -o '[0-9]*$' | tail -1; }
runs=$(stat number_of_executed_units)
crashes=$(comm -13 <(echo "$before") <(ls "$artifacts" | sort) | grep -v '^$' || true)
echo "== results"
printf 'run time:        %.0f s\n' "$(echo "$end - $start" | bc)"
echo "executions:      ${runs:-?}"
echo "execs/second:    $(stat average_exec_per_sec)"
echo "new units:       $(stat new_units_added)"
echo "peak RSS:        $(stat peak_rss_mb) MB"
echo "corpus (work):   $(ls "$work" | wc -l) files"
grep -E '^#[0-9]+.*(DONE|pulse|NEW)' "$log" | tail -1 || true
if [ -n "$crashes" ]; then
    echo "crashes:         $(echo "$crashes" | wc -l)"
    for c in $crashes; do
        echo "--- $artifacts/$c (hex):"
        xxd -p "$artifacts/$c" | tr -d '\n' | cut -c1-2000; echo
        echo "--- its panic:"
        cargo fuzz run --sanitizer "$sanitizer" "$target" "$artifacts/$c" 2>&1 | grep -E -A3 "panicked|ERROR|SUMMARY" | head -20 || true
    done
elif [ "$status" -ne 0 ]; then
    echo "libFuzzer exited with $status but left no artifact; see fuzz/$log" >&2
    exit "$status"
else
    echo "crashes:         0"
fi

if $minimize; then
    echo "== minimizing the corpus"
    fresh=work/merged
    rm -rf "$fresh" && mkdir -p "$fresh"
    cp corpus/$target/seed-* "$fresh"/
    # A set-cover merge keeps every coverage feature in about half the files of a plain one.
    cargo fuzz run --sanitizer "$sanitizer" "$target" "$fresh" "corpus/$target" "$work" -- \
        -set_cover_merge=1 -close_fd_mask=2 >work/merge.log 2>&1
    rm -rf "corpus/$target" && mv "$fresh" "corpus/$target"
    echo "corpus/$target: $(ls corpus/$target | wc -l) files, $(cat corpus/$target/* | wc -c) bytes"
fi
[ -z "$crashes" ]
