"""policies (issue 13's rule): the candidate defaults, `strata`, `adaptive` and `optgate`,
against LRU and the best of ARC, LIRS, S3-FIFO, 2Q and W-TinyLFU, by `strata sim`. A cell
holds when the policy's hit ratio is at least LRU's - 0.1 point and the best of the five's - 1
point, and it promotes at most 0.8x what LRU promotes (every promotion is an origin read and a
cache write).

Two sets of cells:
- in sample: the traces in ../shared/testdata (the CloudPhysics sample; the ARC paper's P2,
  P6 and P12) at their own block size, the cells the policies could have been tuned on;
- held out: the same traces at another block size (CloudPhysics at 64 KiB, the ARC traces
  at 4 KiB), and fio-style synthetic workloads (zipf, pareto, zoned, a scan mix, a loop).

The five are checked against the same rule too, to show what it asks. Writes rule.csv (one
row per policy and cell) and the counts of cells held per policy and set.

Scale 1: 1, 2, 5, 10, 25 and 50% of each footprint; synthetic workloads of 2,000,000
requests over 262,144 blocks (5 to 10 minutes on 2 shared cores, most of it `adaptive` and
`optgate`). Below 0.25: 2 and 25% only, the CloudPhysics sample and two synthetic workloads;
below 0.5, no other block sizes.
"""

import csv
import io

import benchlib as b
import plots

NAME = "policies"
TITLE = "Issue 13's rule: candidate defaults against LRU and the best of five, in sample and held out"
FIVE = ["arc", "lirs", "s3fifo", "2q", "tinylfu"]
CANDIDATES = ["strata", "adaptive", "optgate"]
POLICIES = ["lru", *FIVE, *CANDIDATES]
SIZES = ["1%", "2%", "5%", "10%", "25%", "50%"]
SYNTHETIC = ["zipf:0.8", "zipf:1.2", "pareto:0.2", "zoned:60/10:30/20:10/70", "scanmix:0.9:0.3", "loop"]
SYNTHETIC_BLOCKS = 262_144


def params(scale):
    small = scale < 0.25
    return {
        "sizes": SIZES[1::3] if small else SIZES,
        "requests": max(20_000, int(2_000_000 * scale)),
        "synthetic": SYNTHETIC[:2] if small else SYNTHETIC,
        "all_traces": not small,
        "other_block_sizes": scale >= 0.5,
    }


def expected_seconds(scale):
    p = params(scale)
    traces = 4 if p["all_traces"] else 1
    return 8 + len(p["sizes"]) * (traces * (2 if p["other_block_sizes"] else 1) * 6 + len(p["synthetic"]) * 2 * scale)


TESTDATA = b.ROOT.parent / "shared" / "testdata"
# The ARC paper's traces among them.
ARC_TRACES = ("P2", "P6", "P12")
# The rule's traces, in ../shared/testdata.
TRACES = {
    "cloudphysics-w": TESTDATA / "cloudphysics-w.csv",
    **{n: TESTDATA / "arc" / f"{n}.lis.zst" for n in ARC_TRACES},
}


def traces(p):
    """(name, path, the other block size) of the testdata traces present."""
    found = [("cloudphysics-w", TRACES["cloudphysics-w"], "64KiB")]
    if p["all_traces"]:
        found += [(n, TRACES[n], "4KiB") for n in ARC_TRACES]
    return [t for t in found if t[1].exists()]


def sim(ctx, args, sizes):
    out = b.run([ctx.strata, "sim", *args, "--policy", ",".join(POLICIES), "--size", ",".join(sizes), "--csv"]).stdout
    return list(csv.DictReader(io.StringIO(out)))


def by_size(rows):
    """`strata sim --csv` rows -> {size in blocks: {policy: row}}."""
    out = {}
    for r in rows:
        out.setdefault(int(r["size_blocks"]), {})[r["policy"]] = r
    return dict(sorted(out.items()))


def verdict(d, policy):
    """The rule's verdict on `policy` in one cell, from every policy's row at that size
    (LRU's and the five's at least): unrounded hit ratio (%), the ratio needed, the best of
    the five, promotions against LRU's and whether the rule holds."""
    hit = {p: 100 * float(d[p]["hit_ratio"]) for p in ["lru", *FIVE, policy]}
    best = max(FIVE, key=lambda p: hit[p])
    need = max(hit["lru"] - 0.1, hit[best] - 1.0)
    promo = int(d[policy]["promotions"]) / max(1, int(d["lru"]["promotions"]))
    return {"hit_pct": hit[policy], "needed_pct": need, "best_of_five": best, "promotions_vs_lru": promo,
            "holds": hit[policy] >= need and promo <= 0.8}


def cells(rows, set_name, workload):
    """The rule's verdict for every policy at every size of one run."""
    out = []
    for size, d in by_size(rows).items():
        for p in [*FIVE, *CANDIDATES]:
            v = verdict(d, p)
            out.append({
                "set": set_name, "workload": workload, "size_blocks": size, "policy": p,
                "hit_pct": round(v["hit_pct"], 3), "promotions_vs_lru": round(v["promotions_vs_lru"], 3),
                "needed_pct": round(v["needed_pct"], 3), "best_of_five": v["best_of_five"],
                "holds": int(v["holds"]),
            })
    return out


def run(ctx):
    p = params(ctx.scale)
    out = ctx.dir(NAME)
    prog = ctx.progress
    rows = []
    for name, path, other in traces(p):
        prog.set(step=f"{name}, its own block size")
        rows += cells(sim(ctx, [path], p["sizes"]), "in sample", name)
        if p["other_block_sizes"]:
            prog.set(step=f"{name} at {other} blocks")
            rows += cells(sim(ctx, [path, "--block-size", other], p["sizes"]), "held out", f"{name} at {other}")
    for pat in p["synthetic"]:
        prog.set(step=f"synthetic {pat}")
        args = ["--synthetic", pat, "--blocks", str(SYNTHETIC_BLOCKS), "--requests", str(p["requests"]), "--seed", "1"]
        rows += cells(sim(ctx, args, p["sizes"]), "held out", pat)
    b.write_csv(out / "rule.csv", rows)
    held = {}
    for r in rows:
        k = held.setdefault(r["policy"], {}).setdefault(r["set"], [0, 0])
        k[0] += r["holds"]
        k[1] += 1
    summary = {pol: {s: f"{n} of {t}" for s, (n, t) in sets.items()} for pol, sets in held.items()}
    for pol, sets in summary.items():
        prog.note(f"policies: {pol}: " + ", ".join(f"{s} {v}" for s, v in sets.items()))
    sets = ["in sample", "held out"]
    share = {(None, pol, s): 100 * n / t for pol, by in held.items() for s, (n, t) in by.items()}
    plots.grouped_bars(out / "rule.png", TITLE, [*CANDIDATES, *FIVE], sets, share, "cells where the rule holds (%)",
                       "policy")
    return {"cells_held": summary, "files": ["rule.csv", "rule.png"]}
