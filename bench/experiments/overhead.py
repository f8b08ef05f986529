"""overhead: the NBD data path against its peers (the foundation issue's figures). fio
--ioengine=nbd, 4 KiB random reads and writes at iodepth 32, against strata and nbdkit on
the same backing (file through the page cache, file with O_DIRECT, RAM), qemu-nbd on the
file with O_DIRECT through io_uring (strata's O_DIRECT volume's peer; skipped without
qemu-nbd), plus fio directly on the file (io_uring, O_DIRECT and buffered) as the limit.
Rounds alternate the servers so drift on a shared machine hits all of them; each figure is
the median of the rounds; server CPU per request comes from /proc, and so does the whole
machine's (client, server and the kernel's IO work together, with the share of the cores busy):
what a request costs in all, against the cores there are.

Queue depth: during every run a thread samples the backing file's block device
(/sys/block/DEV/stat: the mean number of requests in flight over each 0.1 s, from the weighted
time in queue), so fio's own depth on the device and strata's can be compared; during the
strata O_DIRECT runs it also reads strata's own gauge (operations at the kernel, from the
admin endpoint's /metrics). After the rounds, one short pass per O_DIRECT series under
`perf stat` counts system calls per request (the timed rounds run without it).

Scale 1: a 1 GiB file, 10 s per run, 3 rounds (about 10 minutes).
"""

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import benchlib as b
import plots

NAME = "overhead"
TITLE = "NBD data path: strata vs nbdkit vs fio on the file"
RWS = ["randread", "randwrite"]
SERIES = ["strata file (page cache)", "strata file (O_DIRECT)", "strata mem", "nbdkit file", "nbdkit memory",
          "qemu-nbd file (O_DIRECT)", "fio io_uring O_DIRECT on the file", "fio io_uring buffered on the file"]


SYSCALLS = ["io_uring_enter", "read", "write", "writev", "recvfrom", "sendmsg", "epoll_wait", "futex"]
DEPTH_INTERVAL_S = 0.1


def block_device(path):
    """The /sys/block directory of the disk holding `path` (a partition's parent disk)."""
    st = os.stat(path)
    d = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    if (d / "partition").exists():
        d = d.parent
    return d if (d / "stat").exists() else None


class DepthSampler:
    """Samples queue depth every DEPTH_INTERVAL_S in a thread: the block device's mean in-flight
    count over the interval (weighted time in queue / time), and, given strata's admin address
    and a volume, strata's own gauge (`strata_device_queue_depth_*`, absent in older builds)."""

    def __init__(self, disk, admin=None, volume=None):
        self.disk, self.admin, self.volume = disk, admin, volume
        self.points = []  # (t_s, disk depth, strata depth)
        self.first = self.last = None  # strata's per-depth seconds at the start and the end
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def disk_queue_ms(self):
        if self.disk is None:
            return None
        return int((self.disk / "stat").read_text().split()[10])

    def strata_gauge(self):
        if not self.admin:
            return None
        try:
            with urllib.request.urlopen(f"http://{self.admin}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        vol = f'volume="{self.volume}"'
        integral, at = None, {}
        for line in text.splitlines():
            if vol not in line:
                continue
            if line.startswith("strata_device_queue_depth_integral_seconds_total{"):
                integral = float(line.rsplit(" ", 1)[1])
            elif line.startswith("strata_device_queue_depth_seconds_total{"):
                at[re.search(r'depth="([^"]+)"', line).group(1)] = float(line.rsplit(" ", 1)[1])
        return None if integral is None else (integral, at)

    def loop(self):
        t0 = time.monotonic()
        prev = (t0, self.disk_queue_ms(), self.strata_gauge())
        self.first = prev[2]
        while not self.stop_ev.wait(DEPTH_INTERVAL_S):
            now = (time.monotonic(), self.disk_queue_ms(), self.strata_gauge())
            dt = now[0] - prev[0]
            disk = (now[1] - prev[1]) / 1000 / dt if now[1] is not None else None
            mine = (now[2][0] - prev[2][0]) / dt if now[2] and prev[2] else None
            self.points.append((now[0] - t0, disk, mine))
            self.last = now[2] or self.last
            prev = now

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join()

    def mean(self, which):
        ys = [p[which] for p in self.points if p[which] is not None]
        return sum(ys) / len(ys) if ys else None

    def histogram(self):
        """Share of the run's time strata's device spent at each depth."""
        if not self.first or not self.last:
            return {}
        d = {k: v - self.first[1].get(k, 0.0) for k, v in self.last[1].items()}
        total = sum(d.values())
        return {k: v / total for k, v in d.items() if v > 0} if total > 0 else {}


def perf_syscalls(pid=None, argv=None):
    """The `perf stat` command that counts system calls, attached to `pid` (until it gets
    SIGINT) or around `argv`, and the path it writes its counts to (see read_perf)."""
    out = Path(f"/var/tmp/strata-perf-{os.getpid()}-{time.monotonic_ns()}.csv")
    events = ",".join(["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{s}" for s in SYSCALLS])
    cmd = ["perf", "stat", "-x", ",", "-o", str(out), "-e", events]
    cmd += ["-p", str(pid)] if pid else ["--", *argv]
    return cmd, out


def perf_counts_syscalls():
    """Whether `perf` is here and may count system call tracepoints (it needs tracefs and a
    low enough perf_event_paranoid): the pass is skipped, with a message, when it may not."""
    if not b.which("perf"):
        print("overhead: perf is not installed: no system-call counts", flush=True)
        return False
    probe = subprocess.run(["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "--", "true"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        print(f"overhead: perf cannot count system calls here ({probe.stderr.strip()[:200]}): skipped", flush=True)
        return False
    return True


def read_perf(path):
    """Per-syscall counts (`all` for every system call) from perf stat's CSV at `path`."""
    counts = {}
    for line in path.read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith(("raw_syscalls", "syscalls")):
            name = parts[2].split(":")[1].replace("sys_enter_", "").replace("sys_enter", "all")
            counts[name] = float(parts[0]) if parts[0][:1].isdigit() else None
    path.unlink(missing_ok=True)
    return counts


class MachineCpu:
    """The whole machine's busy and total CPU seconds over a `with` block."""

    def __enter__(self):
        self.start = b.machine_cpu_seconds()
        return self

    def __exit__(self, *exc):
        end = b.machine_cpu_seconds()
        self.busy, self.all = end[0] - self.start[0], end[1] - self.start[1]


def params(scale):
    size_mib = max(32, int(1024 * scale))
    runtime = max(0.5, round(10 * scale, 1))
    rounds = 3 if scale >= 0.25 else 1
    return size_mib, runtime, rounds, 32


def expected_seconds(scale):
    size_mib, runtime, rounds, _ = params(scale)
    return rounds * len(RWS) * (len(SERIES) * (runtime + 0.5) + 4 * size_mib / 1500) + size_mib / 300


def run(ctx):
    size_mib, runtime, rounds, iodepth = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    img = work / "backing.img"
    p = ctx.progress
    p.set(step="writing the backing file")
    b.fill_random(img, size_mib * b.MIB)

    def warm():
        # Same page-cache state for every run: the whole file cached, and no dirty pages left
        # by the run before for the kernel to write back during this one.
        os.sync()
        subprocess.run(["cat", str(img)], stdout=subprocess.DEVNULL, check=True)

    common = ["--name=job", "--bs=4k", f"--iodepth={iodepth}", f"--runtime={int(runtime * 1000)}ms", "--time_based",
              f"--size={size_mib}M", "--randrepeat=0", "--norandommap"]
    disk = block_device(img)
    results = {}
    depth_rows, depth_hist = [], []

    def record(name, rw, report, server_cpu, machine, depth=None):
        side = b.job_side(report, rw)
        ios = side["total_ios"] if "total_ios" in side else side["io_bytes"] // 4096
        job = report["jobs"][0]
        runtime_s = job["elapsed"] if job.get("elapsed") else runtime
        client_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime_s
        r = results.setdefault(f"{name} {rw}", {"iops": [], "server_us_per_req": [], "client_us_per_req": [],
                                                 "machine_us_per_req": [], "busy_cores": [],
                                                 "disk_queue_depth": [], "strata_queue_depth": []})
        r["iops"].append(side["iops"])
        if server_cpu is not None and ios:
            r["server_us_per_req"].append(server_cpu / ios * 1e6)
        if ios:
            r["client_us_per_req"].append(client_cpu / ios * 1e6)
            r["machine_us_per_req"].append(machine.busy / ios * 1e6)
        if machine.all:
            r["busy_cores"].append(machine.busy / machine.all * os.cpu_count())
        if depth is not None:
            for key, which in (("disk_queue_depth", 1), ("strata_queue_depth", 2)):
                if depth.mean(which) is not None:
                    r[key].append(depth.mean(which))
            depth_rows.extend({"series": name, "rw": rw, "round": rnd, "t_s": round(t, 2), "disk_queue_depth": dq,
                               "strata_queue_depth": sq} for t, dq, sq in depth.points)
            for d, share in sorted(depth.histogram().items(), key=lambda kv: int(kv[0].rstrip("+"))):
                depth_hist.append({"series": name, "rw": rw, "round": rnd, "depth": d, "time_share": share})

    def run_nbd(server, name, export, rw):
        p.set(step=f"round {rnd + 1}/{rounds}: {name} {rw}")
        warm()
        admin = getattr(server, "admin", None)
        with DepthSampler(disk, admin, export) as depth, MachineCpu() as machine:
            rep, cpu = b.fio_server_cpu(server, common + ["--ioengine=nbd", f"--uri={server.uri(export)}", f"--rw={rw}"])
        record(name, rw, rep, cpu, machine, depth)

    def run_fio(name, direct, rw):
        warm()
        with DepthSampler(disk) as depth, MachineCpu() as machine:
            rep = b.fio(common + ["--ioengine=io_uring", f"--direct={direct}", f"--filename={img}", f"--rw={rw}"])
        record(name, rw, rep, None, machine, depth)

    log = ctx.scratch / "overhead-servers.log"
    # qemu-nbd serving the file with O_DIRECT through io_uring: another NBD server on the
    # same path as strata's O_DIRECT volume, for the client's and the round trip's share.
    qemu = b.which("qemu-nbd")
    if not qemu:
        print("overhead: qemu-nbd is not installed: no qemu-nbd series", flush=True)
    for rnd in range(rounds):
        for rw in RWS:
            # A server claims each file it opens: the buffered volume gets a server of its own.
            with b.Strata(ctx, work / "s.sock", f"buffered={img}?direct=off", admin=False) as s:
                run_nbd(s, "strata file (page cache)", "buffered", rw)
            # The admin endpoint gives the O_DIRECT volume's queue-depth gauge.
            with b.Strata(ctx, work / "s.sock", f"direct={img}", f"mem=mem:{size_mib}MiB") as s:
                run_nbd(s, "strata file (O_DIRECT)", "direct", rw)
                # Fill the RAM volume first so reads hit real memory, as nbdkit's do below.
                if rw == "randread":
                    b.fill_nbd(s.uri("mem"), size_mib * b.MIB)
                run_nbd(s, "strata mem", "mem", rw)
            with b.nbdkit(work / "k.sock", "file", str(img), log=log) as k:
                run_nbd(k, "nbdkit file", "", rw)
            with b.nbdkit(work / "k.sock", "memory", f"{size_mib}M", log=log) as k:
                if rw == "randread":
                    b.fill_nbd(k.uri(), size_mib * b.MIB)
                run_nbd(k, "nbdkit memory", "", rw)
            if qemu:
                argv = ["qemu-nbd", "-k", str(work / "q.sock"), "-t", "-f", "raw", "--cache=none", "--aio=io_uring",
                        "-x", "q", str(img)]
                with b.Server(argv, work / "q.sock", log=log) as q:
                    run_nbd(q, "qemu-nbd file (O_DIRECT)", "q", rw)
            p.set(step=f"round {rnd + 1}/{rounds}: fio on the file {rw}")
            run_fio("fio io_uring O_DIRECT on the file", 1, rw)
            run_fio("fio io_uring buffered on the file", 0, rw)

    # System calls per request, in a pass of its own: perf's tracepoints cost the process
    # they count, so none of the timed rounds runs under it.
    syscalls = {}
    if perf_counts_syscalls():
        short = [a if not a.startswith("--runtime=") else f"--runtime={int(min(runtime, 5) * 1000)}ms" for a in common]
        for rw in RWS:
            p.set(step=f"system calls: strata O_DIRECT {rw}")
            with b.Strata(ctx, work / "s.sock", f"direct={img}", admin=False) as s:
                warm()
                cmd, counts = perf_syscalls(pid=s.p.pid)
                perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.3)
                rep, cpu = b.fio_server_cpu(s, short + ["--ioengine=nbd", f"--uri={s.uri('direct')}", f"--rw={rw}"])
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=30)
            ios = b.job_side(rep, rw)["total_ios"]
            syscalls[f"strata file (O_DIRECT) {rw}"] = {k: v / ios for k, v in read_perf(counts).items() if v is not None}
            syscalls[f"strata file (O_DIRECT) {rw}"]["server_us_per_req"] = cpu / ios * 1e6
            p.set(step=f"system calls: fio io_uring O_DIRECT {rw}")
            warm()
            cmd, counts = perf_syscalls(argv=["fio", "--output-format=json", *short, "--ioengine=io_uring", "--direct=1",
                                           f"--filename={img}", f"--rw={rw}"])
            done = b.run(cmd)
            text = done.stdout
            rep = json.loads(text[text.index("{"):])
            ios = b.job_side(rep, rw)["total_ios"]
            syscalls[f"fio io_uring O_DIRECT on the file {rw}"] = {
                k: v / ios for k, v in read_perf(counts).items() if v is not None}
        b.write_csv(out / "syscalls.csv",
                    [{"series": k, **{n: round(v, 3) for n, v in c.items()}} for k, c in syscalls.items()],
                    ["series", "all", *SYSCALLS, "server_us_per_req"])

    summary = {k: {m: b.median(v) for m, v in r.items()} | {"rounds": r["iops"]} for k, r in results.items()}
    ratios = {}
    for rw in RWS:
        ratios[f"file page cache {rw}: strata / nbdkit file"] = (
            summary[f"strata file (page cache) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / nbdkit file"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / fio direct"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"fio io_uring O_DIRECT on the file {rw}"]["iops"])
        # Issue 14's target for the O_DIRECT volume is 0.85x fio's own IOPS: the cores needed
        # to serve that many requests a second at the CPU cost per request this run measured
        # (client, server and kernel together).
        ratios[f"file O_DIRECT {rw}: cores 0.85x fio's IOPS would need"] = (
            0.85 * summary[f"fio io_uring O_DIRECT on the file {rw}"]["iops"]
            * summary[f"strata file (O_DIRECT) {rw}"]["machine_us_per_req"] / 1e6)
        ratios[f"mem {rw}: strata / nbdkit memory"] = (
            summary[f"strata mem {rw}"]["iops"] / summary[f"nbdkit memory {rw}"]["iops"])
        if qemu:
            ratios[f"file O_DIRECT {rw}: strata / qemu-nbd"] = (
                summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"qemu-nbd file (O_DIRECT) {rw}"]["iops"])
            ratios[f"file O_DIRECT {rw}: qemu-nbd / fio direct"] = (
                summary[f"qemu-nbd file (O_DIRECT) {rw}"]["iops"]
                / summary[f"fio io_uring O_DIRECT on the file {rw}"]["iops"])

    rows = []
    for k, r in summary.items():
        name, rw = k.rsplit(" ", 1)
        rows.append({"series": name, "rw": rw, "iops": r["iops"], "server_us_per_req": r["server_us_per_req"],
                     "client_us_per_req": r["client_us_per_req"], "machine_us_per_req": r["machine_us_per_req"],
                     "busy_cores": r["busy_cores"], "disk_queue_depth": r["disk_queue_depth"],
                     "strata_queue_depth": r["strata_queue_depth"]})
    b.write_csv(out / "overhead.csv", rows, ["series", "rw", "iops", "server_us_per_req", "client_us_per_req",
                                             "machine_us_per_req", "busy_cores", "disk_queue_depth",
                                             "strata_queue_depth"])
    b.write_csv(out / "queue_depth.csv", depth_rows,
                ["series", "rw", "round", "t_s", "disk_queue_depth", "strata_queue_depth"])
    b.write_csv(out / "queue_depth_hist.csv", depth_hist, ["series", "rw", "round", "depth", "time_share"])
    last = rounds - 1
    for rw in RWS:
        series = []
        for name, col, label in [("strata file (O_DIRECT)", "strata_queue_depth", "strata O_DIRECT: strata's gauge"),
                                 ("strata file (O_DIRECT)", "disk_queue_depth", "strata O_DIRECT: the disk"),
                                 ("fio io_uring O_DIRECT on the file", "disk_queue_depth", "fio io_uring O_DIRECT: the disk")]:
            pts = [(r["t_s"], r[col]) for r in depth_rows if r["series"] == name and r["rw"] == rw and r["round"] == last]
            series.append((label, pts))
        plots.time_series(out / f"queue_depth_{rw}.png",
                          f"Queue depth over time, 4 KiB {rw} at iodepth 32, round {rounds} of {rounds} (scale "
                          f"{ctx.scale:g}); strata's gauge counts its operations at the kernel, the disk's is "
                          f"/sys/block mean in flight per {DEPTH_INTERVAL_S} s (any other IO on the disk included)",
                          series, "requests in flight", smooth_s=0.5, ylim=(0, iodepth * 1.25))
    b.write_ratios(out, ratios)
    values = {(None, r["rw"], r["series"]): r["iops"] for r in rows}
    plots.grouped_bars(out / "iops.png",
                       f"NBD data path, 4 KiB random IO at iodepth 32 over a Unix socket, {size_mib} MiB file, "
                       f"{runtime} s runs, median of {rounds} alternating rounds (scale {ctx.scale:g}); higher is better",
                       RWS, SERIES, values, "IOPS (log scale)", "workload", log=True)
    return {
        "setup": {"size_mib": size_mib, "runtime_s": runtime, "rounds": rounds, "iodepth": iodepth},
        "results": summary,
        "ratios": ratios,
        "syscalls_per_request": syscalls,
        "files": ["overhead.csv", "ratios.csv", "iops.png", "queue_depth.csv", "queue_depth_hist.csv",
                  "queue_depth_randread.png", "queue_depth_randwrite.png"] + (["syscalls.csv"] if syscalls else []),
    }
