#!/usr/bin/env python3
"""strata's benchmark suite: reproduces the seeds' lvmcache/bcache and dm-cache/writecache
experiments for strata and its peers on this machine.

    bench/run.py EXPERIMENT|all [--scale S] [--out DIR] [--keep-scratch]

Experiments: warmup, small-cache, mixed, writeback, writelog, git, metadata, overhead, connections,
qos, remote, thin, policies (see docs/BENCHMARKS.md).
--scale 1 is the seeds' shapes at a size a 2-core machine runs in about an hour for the
whole suite; --scale 0.01 runs everything in seconds (the test suite does that).

Each experiment writes DIR/NAME/ (CSV, PNG, summary.json); DIR/summary.json collects all
the experiments run into DIR so far. Servers are started and stopped here; scratch files
live under /var/tmp/strata-bench-* and are removed at the end. $STRATA_BIN picks the
strata binary (default target/release/strata).
"""

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib as b  # noqa: E402
from experiments import ALIASES, ORDER  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", help="|".join(ORDER).replace("_", "-") + "|all")
    ap.add_argument("--scale", type=float, default=1.0, help="shrinks sizes and durations (default 1)")
    ap.add_argument("--out", default="bench-out", help="output folder (default bench-out)")
    ap.add_argument("--keep-scratch", action="store_true", help="keep the scratch folder under /var/tmp")
    a = ap.parse_args()
    name = ALIASES.get(a.experiment, a.experiment.replace("-", "_"))
    if name != "all" and name not in ORDER:
        ap.error(f"unknown experiment {a.experiment!r}: one of {', '.join(o.replace('_', '-') for o in ORDER)}, all")
    if a.scale <= 0:
        ap.error("--scale must be positive")
    names = ORDER if name == "all" else [name]
    b.need("fio", "nbdkit")
    b.install_signal_handlers()

    mods = [importlib.import_module(f"experiments.{n}") for n in names]
    expected = sum(m.expected_seconds(a.scale) for m in mods)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = b.Progress(expected)
    ctx = None
    failed = []
    summary_path = out / "summary.json"
    try:
        ctx = b.Context(a.scale, out, progress, keep_scratch=a.keep_scratch)
        doc = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        doc.setdefault("experiments", {})
        for m, n in zip(mods, names):
            progress.set(label=n.replace("_", "-"), step="starting")
            t0 = time.time()
            try:
                res = m.run(ctx)
                res["status"] = "skipped" if res.get("skipped") else "ok"
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - one experiment's failure is reported, the rest run
                b.cleanup()
                res = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                failed.append(n)
                progress.note(f"{n}: FAILED: {e}")
            res["elapsed_s"] = round(time.time() - t0, 1)
            res["scale"] = a.scale
            b.write_json(ctx.dir(n) / "summary.json", res)
            doc["experiments"][n.replace("_", "-")] = res
            doc.update({
                "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
                "scale": a.scale,
                "finished": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "kernel": platform.release(),
                         "python": platform.python_version()},
                "strata": ctx.strata_version,
                "git_head": b.run(["git", "-C", b.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
                "scratch": str(ctx.scratch),
                "fio": b.run(["fio", "--version"], check=False).stdout.strip(),
                "nbdkit": b.run(["nbdkit", "--version"], check=False).stdout.strip(),
            })
            b.write_json(summary_path, doc)
            if res["status"] == "ok":
                progress.note(f"{n}: done in {res['elapsed_s']:.0f} s")
    except KeyboardInterrupt:
        progress.note("interrupted: stopping everything started")
        failed.append("interrupted")
    finally:
        b.cleanup()
        progress.close()
        if ctx:
            ctx.remove_scratch()
    print(f"results in {out}/ (summary.json)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
