"""metadata (seed 004's metarates test): file create+close, stat and utime rates on ext4
over nbdfuse + a loop device, for the hdd: origin alone, the fast device alone (a plain file
on the file system that holds the cache files), and strata's `cache` in writeback and in
writethrough (64 KiB blocks, a fast device as large as the volume), all through the same
path. For 1, 2 and 4 processes, 10 runs each: the processes share one new directory per
run (removed after it, untimed), each working on files of its own. Create makes each file,
fsyncs it and closes it (metarates' creat, fsync and close: a durable create), then syncs
the file system. The file system is then remounted cold (a fresh loop device, the page
cache dropped) and stat reads every file's inode. Utime sets every file's times, then
syncs. Each phase's time includes its sync. The figures are operations per second per
process (the seed's "per core" rates), mean and standard deviation over the runs.

Scale 1: a 1 GiB volume, 500 files per process per run, 10 runs.
Needs root, /dev/fuse, a free loop device, nbdfuse and mkfs.ext4; skipped otherwise.
"""

import multiprocessing
import os
import shutil
import statistics
import time

import benchlib as b
import plots
from experiments.git import TOOLS, FuseLoop, skipped

NAME = "metadata"
TITLE = "metarates on ext4: create+close, stat, utime per process, for 1, 2 and 4 processes"
BLOCK = 64 * b.KIB
PROCS = [1, 2, 4]
PHASES = ["create+close", "stat", "utime"]
ORIGIN, FAST, WRITEBACK, WRITETHROUGH = "origin alone", "fast alone", "cache writeback", "cache writethrough"
CONFIGS = [ORIGIN, FAST, WRITEBACK, WRITETHROUGH]


def params(scale):
    vol = max(256, int(1024 * scale)) * b.MIB
    files = max(20, int(500 * scale))
    runs = 10 if scale >= 0.25 else 2
    return vol, files, runs


def expected_seconds(scale):
    vol, files, runs = params(scale)
    per_run = 3 * 2.5 + sum(PROCS) * files / 150
    return len(CONFIGS) * (runs * per_run + 10 + vol / (60 * b.MIB))


def _work(phase, d, proc, files, start):
    names = [os.path.join(d, f"p{proc}.f{i}") for i in range(files)]
    start.wait()
    if phase == "create+close":
        for n in names:
            fd = os.open(n, os.O_CREAT | os.O_WRONLY, 0o644)
            os.fsync(fd)
            os.close(fd)
    elif phase == "stat":
        for n in names:
            os.stat(n)
    else:
        now = time.time()
        for i, n in enumerate(names):
            os.utime(n, (now + i, now + i))


def phase_rate(phase, d, procs, files, sync_dir):
    """Runs `phase` in `procs` processes at once; returns operations per second per process
    (the phase's time counts from the start to the end of its sync)."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(procs + 1)
    ps = [ctx.Process(target=_work, args=(phase, d, i, files, start)) for i in range(procs)]
    for p in ps:
        p.start()
    start.wait()
    t0 = time.time()
    for p in ps:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a {phase} process exited with {p.exitcode}")
    if phase != "stat":
        b.run(["sync", "-f", sync_dir], timeout=600)
    return files / (time.time() - t0)


def one_config(ctx, label, spec, vol, files, runs, work):
    """mkfs.ext4 on `spec`, then `runs` runs of every phase at every process count."""
    p = ctx.progress
    rates = {}  # (phase, procs): one rate per run
    with b.Strata(ctx, work / "s.sock", f"vol={spec}", admin=False) as s:
        fl = FuseLoop(ctx, s.uri("vol"), work)
        try:
            p.set(step=f"{label}: mkfs.ext4")
            fl.make_ext4()
            for run in range(runs):
                for procs in PROCS:
                    p.set(step=f"{label}: run {run + 1}/{runs}, {procs} processes")
                    d = fl.mnt / f"r{run}.np{procs}"
                    d.mkdir()
                    b.run(["sync", "-f", fl.mnt], timeout=600)
                    for phase in PHASES:
                        if phase == "stat":
                            fl.remount_cold(drop_caches=True)
                        rates.setdefault((phase, procs), []).append(phase_rate(phase, d, procs, files, fl.mnt))
                    shutil.rmtree(d)  # untimed: every run starts on the same file system
        finally:
            fl.close()
    return rates


def run(ctx):
    if skip := skipped(ctx, NAME, [t for t in TOOLS if t != "git"]):
        return skip
    vol, files, runs = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    p = ctx.progress
    origin, fast, cachef = work / "origin.img", work / "fast.img", work / "cache.img"
    p.set(step="writing the devices")
    b.fill_random(origin, vol)
    b.fill_random(fast, vol)
    # Written through first, as the fast device alone: a device has no holes.
    b.fill_random(cachef, b.cache_file_bytes(vol, BLOCK))
    all_rates = {}
    for label in CONFIGS:
        spec = {ORIGIN: f"hdd:{origin}", FAST: str(fast)}.get(label, f"cache:{cachef}")
        if label in (WRITEBACK, WRITETHROUGH):
            b.cache_create(ctx, f"hdd:{origin}", str(cachef), block_size="64KiB",
                           mode="writeback" if label == WRITEBACK else "writethrough")
        all_rates[label] = one_config(ctx, label, spec, vol, files, runs, work)
        p.note(f"  {NAME}: {label}: " + ", ".join(
            f"{ph} {statistics.mean(all_rates[label][(ph, 1)]):,.0f}/s" for ph in PHASES))

    rows, values, errors = [], {}, {}
    for label, rates in all_rates.items():
        for (phase, procs), rs in rates.items():
            mean, sd = statistics.mean(rs), statistics.stdev(rs) if len(rs) > 1 else 0.0
            rows.append({"config": label, "phase": phase, "processes": procs, "mean_ops_per_s": mean,
                         "stdev_ops_per_s": sd, "runs": len(rs)})
            values[(phase, label, f"NP={procs}")] = mean
            errors[(phase, label, f"NP={procs}")] = sd
    b.write_csv(out / "rates.csv", rows, ["config", "phase", "processes", "mean_ops_per_s", "stdev_ops_per_s", "runs"])

    def mean_of(label, phase, procs):
        return statistics.mean(all_rates[label][(phase, procs)])

    ratios = {}
    for procs in PROCS:
        for cache in (WRITEBACK, WRITETHROUGH):
            for phase in PHASES:
                ratios[f"{cache} / origin alone: {phase} NP={procs}"] = (
                    mean_of(cache, phase, procs) / mean_of(ORIGIN, phase, procs))
                ratios[f"{cache} / fast alone: {phase} NP={procs}"] = (
                    mean_of(cache, phase, procs) / mean_of(FAST, phase, procs))
    b.write_ratios(out, ratios)
    plots.grouped_bars(out / "rates.png",
                       f"metarates on ext4 over nbdfuse + loop, {vol // b.MIB} MiB volume, {files} files per "
                       f"process, mean and standard deviation of {runs} runs; cache: 64 KiB blocks over the hdd: "
                       f"origin (scale {ctx.scale:g}); higher is better",
                       CONFIGS, [f"NP={n}" for n in PROCS], values, "operations per second per process",
                       "configuration", panels=PHASES, errors=errors)
    return {
        "setup": {"volume_bytes": vol, "files_per_process": files, "runs": runs, "processes": PROCS,
                  "cache_block_bytes": BLOCK},
        "rates": {f"{label}: {phase} NP={procs}": {"mean": statistics.mean(rs), "runs": rs}
                  for label, rates in all_rates.items() for (phase, procs), rs in rates.items()},
        "ratios": ratios,
        "files": ["rates.csv", "ratios.csv", "rates.png"],
    }
