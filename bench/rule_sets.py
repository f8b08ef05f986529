#!/usr/bin/env python3
"""Issue 13's rule on every set of cells `docs/BENCHMARKS.md` reports for a decision of the
default policy: in sample, held out, and the four fresh sets, each made for one decision
(258 cells out of sample in all). A cell holds when the policy's hit ratio is at least LRU's
- 0.1 point and the best of ARC, LIRS, S3-FIFO, 2Q and W-TinyLFU's - 1 point, with at most
0.8x LRU's promotions (the same verdict as `bench/run.py policies`).

    bench/rule_sets.py [--strata BIN] [--policy optgate] [--sets in,held,fresh1,...] [-j 2]
                       [--json out.json]

Prints, per set, the cells held and the points short summed over the cells missed on hits
(need - hit, where positive); with several policies (`--policy optgate,arc,opt`), each one's
lines and then the cells at least one of them holds. `--json` writes every cell. A policy's
figures are only worth comparing with another build's from the same script: the sets are
fixed here so that they are. A full run of `optgate` takes 10 to 16 minutes on 2 cores.
"""

import argparse
import csv
import io
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as b  # noqa: E402
from experiments.policies import FIVE, SIZES, SYNTHETIC, SYNTHETIC_BLOCKS, TRACES, by_size, verdict  # noqa: E402


def synthetic(patterns, blocks, requests, seed):
    args = ["--blocks", str(blocks), "--requests", str(requests), "--seed", str(seed)]
    return [(p, ["--synthetic", p, *args]) for p in patterns]


def traces(pairs):
    """(trace, block size or None for its own) -> workloads."""
    out = []
    for name, bs in pairs:
        args = [str(TRACES[name])] + (["--block-size", bs] if bs else [])
        out.append((f"{name} at {bs}" if bs else name, args))
    return out


# Each set as docs/BENCHMARKS.md defines it (the section that made it is named).
SETS = {
    # The rule's own cells.
    "in": traces([(n, None) for n in TRACES]),
    # `bench/run.py policies`' held-out cells.
    "held": traces([("cloudphysics-w", "64KiB"), ("P2", "4KiB"), ("P6", "4KiB"), ("P12", "4KiB")])
    + synthetic(SYNTHETIC, SYNTHETIC_BLOCKS, 2_000_000, 1),
    # "`optgate`: ghosts for half a cache".
    "fresh1": synthetic(["zipf:1.05", "zipf:0.6", "pareto:0.3", "zoned:80/20:20/80", "scanmix:0.8:0.5",
                         "zoned:50/5:30/15:20/80"], 200_000, 1_500_000, 7)
    + traces([("cloudphysics-w", "16KiB"), ("P6", "16KiB")]),
    # "`optgate`: OPTgen follows six times the miniatures' sample".
    "fresh2": traces([("cloudphysics-w", "8KiB"), ("P2", "8KiB"), ("P12", "8KiB")])
    + synthetic(["zipf:0.9", "pareto:0.5", "zoned:70/10:30/90", "scanmix:0.7:0.2"], 300_000, 1_500_000, 11),
    # "`optgate`: the multiple kept, a graded doorkeeper measured".
    "fresh3": traces([("cloudphysics-w", "32KiB"), ("P2", "32KiB"), ("P6", "8KiB"), ("P12", "16KiB")])
    + synthetic(["zipf:0.95", "pareto:0.15", "zoned:90/10:10/90", "scanmix:0.85:0.4", "zoned:40/5:40/25:20/70"],
                400_000, 2_000_000, 23),
    # "`optgate`: a point's allowance, as `adaptive`'s".
    "fresh4": traces([("cloudphysics-w", "128KiB"), ("P2", "2KiB"), ("P6", "32KiB"), ("P12", "64KiB")])
    + synthetic(["zipf:0.7", "zipf:1.1", "pareto:0.25", "zoned:75/15:25/85", "scanmix:0.95:0.2"],
                500_000, 2_500_000, 31),
}


def verdicts(strata, policies, set_name, workload, args):
    """The rule's verdict on each of `policies` at each size of one workload (one replay)."""
    replayed = list(dict.fromkeys(["lru", *FIVE, *policies]))
    cmd = [strata, "sim", *args, "--policy", ",".join(replayed), "--size", ",".join(SIZES), "--csv"]
    rows = csv.DictReader(io.StringIO(b.run(cmd).stdout))
    return [{"set": set_name, "workload": workload, "size_blocks": size, "policy": p, **verdict(d, p)}
            for size, d in by_size(rows).items() for p in policies]


def print_sets(cells, names, short=True):
    """Per set, the cells held and (with `short`) the points short summed over the cells
    missed on hits (need - hit, where positive); then the cells held out of sample."""
    out_of_sample = [0, 0]
    for s in names:
        mine = [c for c in cells if c["set"] == s]
        held = sum(c["holds"] for c in mine)
        line = f"{s:>7}: {held} of {len(mine)} held"
        if short:
            points = sum(max(0.0, c["needed_pct"] - c["hit_pct"]) for c in mine if not c["holds"])
            line += f", {points:.2f} points short"
        print(line)
        if s != "in":
            out_of_sample[0] += held
            out_of_sample[1] += len(mine)
    if out_of_sample[1]:
        print(f"out of sample: {out_of_sample[0]} of {out_of_sample[1]} held")


def held_by_any(cells):
    """One cell per set, workload and size, held where any policy judged holds it."""
    out = {}
    for c in cells:
        key = (c["set"], c["workload"], c["size_blocks"])
        out[key] = {"set": c["set"], "holds": out.get(key, {}).get("holds", False) or c["holds"]}
    return list(out.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=str(b.strata_bin()))
    ap.add_argument("--policy", default="optgate",
                    help="comma-separated: each is judged on its own, from one replay per workload")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated, of: " + ", ".join(SETS))
    ap.add_argument("-j", type=int, default=2, help="workloads replayed at once")
    ap.add_argument("--json", help="write every cell here")
    a = ap.parse_args()
    names = a.sets.split(",")
    unknown = [n for n in names if n not in SETS]
    if unknown:
        ap.error(f"unknown set(s): {', '.join(unknown)}")
    if not Path(a.strata).is_file():
        ap.error(f"no strata binary at {a.strata} (build it: cargo build --release -p strata)")
    missing = [str(t) for t in TRACES.values() if not t.exists()]
    if missing:
        ap.error(f"missing trace(s): {', '.join(missing)}")
    policies = list(dict.fromkeys(a.policy.split(",")))
    jobs = [(s, w, args) for s in names for w, args in SETS[s]]
    with ThreadPoolExecutor(a.j) as pool:
        results = list(pool.map(lambda j: verdicts(a.strata, policies, *j), jobs))
    cells = [c for r in results for c in r]
    for policy in policies:
        if len(policies) > 1:
            print(f"{policy}:")
        print_sets([c for c in cells if c["policy"] == policy], names)
    if len(policies) > 1:
        print("held by at least one of them:")
        print_sets(held_by_any(cells), names, short=False)
    if a.json:
        Path(a.json).write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
