"""Shared pieces of the benchmark scripts: starting servers, running fio, reading CPU time.

Every benchmark compares strata with a peer measured in the same run and reports ratios;
the machines these run on are shared and noisy, so each figure is the median of rounds.
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATA = ROOT / "target" / "release" / "strata"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def need(*progs):
    missing = [p for p in progs if shutil.which(p) is None]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: run scripts/setup.sh first")


def cpu_seconds(pid):
    """User+system CPU seconds used so far by a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_for_socket(path, proc, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.args}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(path))
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not come up on {path}")


class Server:
    """A server process listening on a Unix socket, stopped with SIGTERM on exit."""

    def __init__(self, argv, sock):
        self.sock = Path(sock)
        if self.sock.exists():
            self.sock.unlink()
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_socket(self.sock, self.proc)

    def uri(self, export=""):
        return f"nbd+unix:///{export}?socket={self.sock}"

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def strata(sock, *volumes, extra=()):
    return Server([str(STRATA), "serve", "--unix", str(sock), *extra, *volumes], sock)


def nbdkit(sock, plugin, *args, filters=()):
    argv = ["nbdkit", "-f", "-U", str(sock)] + [f"--filter={f}" for f in filters] + [plugin, *args]
    return Server(argv, sock)


def fio(args, timeout=None):
    """Runs fio with --output-format=json; returns the parsed report."""
    out = subprocess.run(["fio", "--output-format=json", *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {' '.join(args)}\n{out.stderr}")
    text = out.stdout
    return json.loads(text[text.index("{"):])


def job_side(report, rw):
    job = report["jobs"][0]
    return job["write"] if "write" in rw and "read" not in rw.replace("readwrite", "") else job["read"]


def median(xs):
    return statistics.median(xs) if xs else float("nan")
