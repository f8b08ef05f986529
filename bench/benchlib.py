"""Shared pieces of the benchmark suite: scratch space, starting and stopping servers, running
fio with IOPS logs, polling strata's admin endpoint, a one-line progress display, CSV output.

Every benchmark compares strata with a peer measured in the same run and reports ratios;
the machines these run on are shared and noisy, so a figure on its own means little.

Rules every experiment keeps: every process is started in its own process group and
registered here, and `cleanup()` (called by run.py in a finally block and at exit) stops
whatever is still running; all files live under one scratch directory under /var/tmp that
is removed at the end.
"""

import atexit
import csv
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20
KIB = 1 << 10


def strata_bin():
    """The strata binary: $STRATA_BIN, else target/release/strata."""
    return Path(os.environ.get("STRATA_BIN") or ROOT / "target" / "release" / "strata")


# Kept for the old scripts' sake; experiments use `ctx.strata`, a private copy (see Context).
STRATA = strata_bin()

SBIN = ["/usr/local/sbin", "/usr/sbin", "/sbin"]


def _env_with_sbin():
    env = dict(os.environ)
    parts = env.get("PATH", "").split(":")
    env["PATH"] = ":".join(parts + [d for d in SBIN if d not in parts])
    return env


ENV = _env_with_sbin()


def which(prog):
    return shutil.which(prog, path=ENV["PATH"])


def need(*progs):
    missing = [p for p in progs if which(p) is None]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run scripts/setup.sh first")


def cpu_seconds(pid):
    """User+system CPU seconds used so far by a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu_seconds():
    """(busy, all) CPU seconds of the whole machine so far, every core summed, from /proc/stat:
    busy is user, nice, system, irq and softirq time; all adds idle and iowait."""
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:8]]
    busy = t[0] + t[1] + t[2] + t[5] + t[6]
    return busy / CLK_TCK, (busy + t[3] + t[4]) / CLK_TCK


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def size_str(n):
    """Bytes as fio and strata both read them (MiB granularity where possible)."""
    if n % MIB == 0:
        return f"{n // MIB}MiB"
    if n % KIB == 0:
        return f"{n // KIB}KiB"
    return str(n)


def fio_size(n):
    """Bytes in fio's spelling (fio reads M as MiB)."""
    if n % MIB == 0:
        return f"{n // MIB}M"
    if n % KIB == 0:
        return f"{n // KIB}k"
    return str(n)


# --------------------------------------------------------------------------- processes

_live = []  # every Proc started and not yet stopped
_live_lock = threading.Lock()


class Proc:
    """A child process in its own process group, stopped (the whole group) by stop()."""

    def __init__(self, argv, log=None, env=None, cwd=None):
        self.argv = [str(a) for a in argv]
        self.log = Path(log) if log else None
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env=env or ENV, cwd=cwd, start_new_session=True)
        finally:
            if self.log:
                out.close()
        with _live_lock:
            _live.append(self)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def log_tail(self, n=2000):
        if self.log and self.log.exists():
            return self.log.read_text(errors="replace")[-n:]
        return ""

    def stop(self, timeout=60, sig=signal.SIGTERM):
        """SIGTERM to the process group, then SIGKILL after `timeout`; returns the exit code."""
        try:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.proc.wait()
            else:
                # The leader exited; make sure nothing else of its group lingers.
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        finally:
            with _live_lock:
                if self in _live:
                    _live.remove(self)
        return self.proc.returncode


def run(argv, timeout=None, check=True, cwd=None, env=None, input=None):
    """Runs a command to completion in its own process group (killed whole on timeout or
    interrupt); returns CompletedProcess with text output."""
    p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env or ENV,
                         start_new_session=True)
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    cp = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check and p.returncode != 0:
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(map(str, argv))}\n{err[-3000:]}")
    return cp


_cleanups = []  # callables run by cleanup(), newest first (unmounts, loop detaches)


def on_cleanup(fn):
    _cleanups.append(fn)
    return fn


def cleanup():
    """Stops every process still running and runs registered cleanups. Safe to call twice."""
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - cleanup must go on
            print(f"\ncleanup: {e}", file=sys.stderr)
    with _live_lock:
        procs = list(reversed(_live))
    for p in procs:
        try:
            p.stop(timeout=20)
        except Exception as e:  # noqa: BLE001
            print(f"\ncleanup: stopping {p.argv[0]}: {e}", file=sys.stderr)


atexit.register(cleanup)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers():
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)


def wait_for_socket(path, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not proc.alive():
            raise RuntimeError(f"server exited early: {' '.join(proc.argv)}\n{proc.log_tail()}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not come up on {path}\n{proc.log_tail()}")


class Server:
    """A server listening on a Unix socket; stop() sends SIGTERM and checks a clean exit."""

    def __init__(self, argv, sock, log=None, env=None):
        self.sock = Path(sock)
        if self.sock.exists():
            self.sock.unlink()
        self.p = Proc(argv, log=log, env=env)
        self.proc = self.p.proc
        wait_for_socket(self.sock, self.p)

    def uri(self, export=""):
        return f"nbd+unix:///{export}?socket={self.sock}"

    def cpu(self):
        return cpu_seconds(self.p.pid)

    def stop(self):
        rc = self.p.stop()
        if rc not in (0, None, -signal.SIGTERM):
            raise RuntimeError(f"{self.p.argv[0]} exited with {rc}\n{self.p.log_tail()}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Strata(Server):
    """`strata serve` with an admin endpoint."""

    def __init__(self, ctx, sock, *volumes, admin=True, extra=()):
        self.admin = f"127.0.0.1:{free_port()}" if admin else None
        argv = [ctx.strata, "serve", "--unix", sock, *(["--admin", self.admin] if admin else []), *extra, *volumes]
        super().__init__(argv, sock, log=ctx.scratch / "strata-serve.log")

    def status(self):
        with urllib.request.urlopen(f"http://{self.admin}/status", timeout=5) as r:
            return json.loads(r.read())

    def target(self, name):
        for v in self.status()["volumes"]:
            if v["name"] == name:
                return v.get("target") or {}
        raise KeyError(name)

    def message(self, name, msg):
        req = urllib.request.Request(f"http://{self.admin}/volumes/{name}/message", data=msg.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def wait_clean(self, name, timeout=600):
        """Asks for a flush of every dirty block and waits until none is left."""
        self.message(name, "flush")
        deadline = time.time() + timeout
        while self.target(name).get("dirty_blocks", 0) > 0:
            if time.time() > deadline:
                raise RuntimeError(f"{name}: dirty blocks left after {timeout} s")
            time.sleep(0.2)


def strata(sock, *volumes, extra=()):
    """Plain server without admin (the old overhead script's helper)."""
    return Server([str(STRATA), "serve", "--unix", str(sock), *extra, *volumes], sock)


def nbdkit(sock, plugin, *args, filters=(), log=None, env=None):
    argv = ["nbdkit", "-f", "-U", str(sock)] + [f"--filter={f}" for f in filters] + [plugin, *args]
    return Server(argv, sock, log=log, env=env)


# --------------------------------------------------------------------------------- fio

def fio(args, timeout=None, prefix=(), env=None):
    """Runs fio with --output-format=json; returns the parsed report. `prefix` goes before
    fio's name (a user switch), `env` is added to the environment."""
    out = run([*prefix, "fio", "--output-format=json", *args], timeout=timeout, check=False,
              env=ENV | env if env else None, cwd="/" if prefix else None)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {' '.join(args)}\n{out.stderr[-3000:]}")
    text = out.stdout
    return json.loads(text[text.index("\n{") + 1 if not text.startswith("{") else 0:])


def fill_nbd(uri, size_bytes):
    """Writes the whole of an NBD export in 1 MiB requests, so that reads of it hit data."""
    fio(["--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M", f"--size={fio_size(size_bytes)}"])


def fio_server_cpu(server, args):
    """Runs fio with `args`; returns its report and the CPU seconds `server` used meanwhile."""
    before = server.cpu()
    report = fio(args)
    return report, server.cpu() - before


def job_side(report, rw):
    job = report["jobs"][0]
    return job["write"] if "write" in rw and "read" not in rw.replace("readwrite", "") else job["read"]


def total_iops(report):
    return sum(j["read"]["iops"] + j["write"]["iops"] for j in report["jobs"])


def total_ios(report):
    return sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in report["jobs"])


def read_iops_logs(prefix, njobs, bucket_ms=500):
    """Sums fio's per-job IOPS logs (`PREFIX_iops.N.log`: time_ms, value, ddir, ...) into
    one series of (t_s, iops) per `bucket_ms`, all jobs and directions together."""
    sums = {}
    for n in range(1, njobs + 1):
        path = Path(f"{prefix}_iops.{n}.log")
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 3:
                continue
            k = max(1, round(int(parts[0]) / bucket_ms))
            sums[k] = sums.get(k, 0) + int(parts[1])
    return [(k * bucket_ms / 1000, v) for k, v in sorted(sums.items())]


def time_to_reach(series, level, window_s=5.0):
    """First time at which the moving average of `series` over `window_s` reaches `level`."""
    pts = list(series)
    for i, (t, _) in enumerate(pts):
        w = [v for (u, v) in pts[: i + 1] if u > t - window_s]
        if t >= window_s and mean(w) >= level:
            return t
    return None


# -------------------------------------------------------------------------- status poll

class StatusPoller:
    """Polls a strata admin /status every `interval_s` in a thread and records, per poll,
    the cache counters of one volume and the hit ratio of the interval since the last one."""

    FIELDS = ["read_hits", "read_misses", "write_hits", "write_misses", "promotions", "demotions",
              "writebacks", "writeback_writes", "dirty_blocks", "cached_blocks", "cache_blocks", "hit_ratio_10s"]

    def __init__(self, server, volume, interval_s=0.5):
        self.server, self.volume, self.interval = server, volume, interval_s
        self.rows = []
        self.baseline = None
        self._stop = threading.Event()
        self._t0 = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        # Counters are cumulative since the server started: the rows keep them as they are,
        # totals() subtracts what was there before this run (a prefill, a junk fill).
        try:
            self.baseline = self.server.target(self.volume)
        except Exception:  # noqa: BLE001
            self.baseline = None
        self._t0 = time.time()
        self._thread.start()
        return self

    def _loop(self):
        prev = None
        if self.baseline:
            t = self.baseline
            hits = t["read_hits"] + t["write_hits"]
            prev = (hits, hits + t["read_misses"] + t["write_misses"])
        while not self._stop.is_set():
            try:
                t = self.server.target(self.volume)
            except Exception:  # noqa: BLE001 - a missed poll is only a gap
                t = None
            if t:
                now = time.time() - self._t0
                row = {"t_s": round(now, 3)} | {f: t.get(f) for f in self.FIELDS}
                hits = t["read_hits"] + t["write_hits"]
                total = hits + t["read_misses"] + t["write_misses"]
                if prev is not None and total > prev[1]:
                    row["hit_ratio"] = (hits - prev[0]) / (total - prev[1])
                else:
                    row["hit_ratio"] = None
                prev = (hits, total)
                self.rows.append(row)
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)
        return self.rows

    def totals(self):
        """Counters of this run alone (last poll minus the baseline) and its hit ratio."""
        if not self.rows:
            return {}
        last, base = self.rows[-1], self.baseline or {}
        d = {f: (last[f] or 0) - (base.get(f) or 0) for f in
             ["read_hits", "read_misses", "write_hits", "write_misses", "promotions", "demotions", "writebacks"]}
        hits = d["read_hits"] + d["write_hits"]
        total = hits + d["read_misses"] + d["write_misses"]
        d["hit_ratio"] = hits / total if total else None
        d["read_hit_ratio"] = d["read_hits"] / (d["read_hits"] + d["read_misses"]) if d["read_hits"] + d["read_misses"] else None
        d["cached_blocks_end"] = last["cached_blocks"]
        d["dirty_blocks_end"] = last["dirty_blocks"]
        return d

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ----------------------------------------------------------------------------- progress

class Progress:
    """A single status line on stderr: elapsed / expected time, experiment, current step.
    Redrawn in place on a terminal; on a pipe, one line per step."""

    def __init__(self, expected_s=0.0, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.t0 = time.time()
        self.expected = expected_s
        self.label = ""
        self.step = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        if self.tty:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    @staticmethod
    def _fmt(s):
        s = int(max(0, s))
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"

    def line(self):
        el = time.time() - self.t0
        exp = f" / ~{self._fmt(self.expected)}" if self.expected else ""
        return f"[{self._fmt(el)}{exp}] {self.label}: {self.step}"

    def _draw(self):
        with self._lock:
            text = self.line()
            if self.tty:
                width = shutil.get_terminal_size((120, 20)).columns - 1
                self.stream.write("\r\033[K" + text[:width])
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def _loop(self):
        while not self._stop.wait(0.5):
            self._draw()

    def set(self, label=None, step=None):
        if label is not None:
            self.label = label
        if step is not None:
            self.step = step
        self._draw()

    def note(self, text):
        """A line of its own (a result), above the status line."""
        with self._lock:
            if self.tty:
                self.stream.write("\r\033[K")
            self.stream.write(text + "\n")
            self.stream.flush()
        if self.tty:
            self._draw()

    def close(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        if self.tty:
            self.stream.write("\r\033[K" + self.line() + "\n")
            self.stream.flush()


# ------------------------------------------------------------------------------ context

class Context:
    """What an experiment gets: scale, output folder, scratch folder, a private copy of the
    strata binary (so a rebuild during a long run changes nothing), the progress line."""

    def __init__(self, scale, out, progress, keep_scratch=False):
        self.scale = scale
        self.out = Path(out)
        self.progress = progress
        self.scratch = Path(tempfile.mkdtemp(prefix="strata-bench-", dir="/var/tmp"))
        self.keep_scratch = keep_scratch
        src = strata_bin()
        if not src.exists():
            raise SystemExit(f"{src} is missing: build it (cargo build --release --bin strata) or set STRATA_BIN")
        self.strata = self.scratch / "strata"
        shutil.copy2(src, self.strata)
        self.strata_version = run([self.strata, "--version"], check=False).stdout.strip()

    def dir(self, name):
        d = self.out / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def work(self, name):
        d = self.scratch / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def remove_scratch(self):
        if not self.keep_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def fill_random(path, size_bytes):
    """A file of `size_bytes` of incompressible data (real blocks, not holes, so reads of
    it cost what reads of data cost)."""
    with open("/dev/urandom", "rb") as src, open(path, "wb") as dst:
        chunk = src.read(4 * MIB)  # one random chunk, varied per position: cheap and dense
        left = size_bytes
        i = 0
        while left > 0:
            n = min(left, len(chunk))
            head = i.to_bytes(8, "little")
            dst.write(head + chunk[8:n] if n > 8 else chunk[:n])
            left -= n
            i += 1


def cache_create(ctx, origin, cache, **opts):
    """`strata cache create`; returns the number of cache blocks it made."""
    argv = [ctx.strata, "cache", "create", "--json", "--origin", origin, "--cache", cache, "--force"]
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return json.loads(run(argv).stdout)["cache_blocks"]


def writecache_create(ctx, origin, cache, **opts):
    """`strata writecache create` (a write log over `origin`)."""
    argv = [ctx.strata, "writecache", "create", "--origin", origin, "--cache", cache, "--force"]
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    run(argv)


def cache_file_bytes(data_bytes, block_bytes):
    """A cache device size whose data area holds at least `data_bytes` (the superblock,
    mapping table and hints come first)."""
    slots = -(-data_bytes // block_bytes)
    meta = 2 * MIB + slots * 64 + (slots * 32 + 64 * KIB)
    return -(-(slots * block_bytes + meta) // MIB) * MIB


# ---------------------------------------------------------------------------------- csv

def write_ratios(out, ratios):
    """An experiment's figures against their peers, `ratios` {name: value}, as out/ratios.csv."""
    write_csv(out / "ratios.csv", [{"ratio": k, "value": v} for k, v in ratios.items()], ["ratio", "value"])


def write_csv(path, rows, fields=None):
    rows = list(rows)
    if fields is None:
        fields = []
        for r in rows:
            for k in r:
                if k not in fields:
                    fields.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if _finite(r.get(k)) is None else (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r[k]))
                        for k in fields})


def _finite(x):
    """NaN and infinities as null: JSON has no spelling for them."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(path, doc):
    Path(path).write_text(json.dumps(_finite(doc), indent=2, default=str, allow_nan=False) + "\n")
