"""The zipf rig shared by `warmup` and `small-cache` (seed 000's job): an emulated `hdd:`
origin, a real cache file, and fio --ioengine=nbd with two 4 KiB randread jobs, zipf:1.2,
iodepth 8, each on its own region, IOPS logged every 500 ms.

Origin layout (D = data size): [0, D) the two measured regions, [2D, 3D) the junk region
that only the junk fill touches; the origin is 4D long.
"""

import time
from pathlib import Path

import benchlib as b

BLOCK = 64 * b.KIB


class Rig:
    def __init__(self, ctx, name, data_bytes, cache_data_bytes):
        self.ctx = ctx
        self.name = name
        self.work = ctx.work(name)
        self.data = data_bytes
        self.region = data_bytes // 2
        self.origin_bytes = 4 * data_bytes
        self.junk_offset = 2 * data_bytes
        self.origin = self.work / "origin.img"
        self.cache = self.work / "cache.img"
        self.cache_bytes = b.cache_file_bytes(cache_data_bytes, BLOCK)
        self.cache_data = cache_data_bytes
        self.sock = self.work / "s.sock"
        self.ksock = self.work / "k.sock"
        self.slots = None

    def prepare(self):
        """Writes the origin and the cache file with data, and cuts the cache file so that its
        data area holds exactly the blocks asked for (cache size = what the experiment says)."""
        self.ctx.progress.set(step="writing the origin and cache files")
        b.fill_random(self.origin, self.origin_bytes)
        b.fill_random(self.cache, self.cache_bytes)
        want = -(-self.cache_data // BLOCK)
        for _ in range(4):
            slots = self.create_cache()
            if slots <= want:
                break
            self.cache_bytes -= (slots - want) * BLOCK
            with open(self.cache, "r+b") as f:
                f.truncate(self.cache_bytes)

    @property
    def origin_spec(self):
        return f"hdd:{self.origin}"

    def create_cache(self, mode="writeback", policy="strata"):
        """A freshly formatted cache (an empty one) on the cache file."""
        self.slots = b.cache_create(self.ctx, self.origin_spec, str(self.cache), block_size="64KiB", mode=mode,
                                    policy=policy)
        return self.slots

    def serve_cache(self):
        return b.Strata(self.ctx, self.sock, f"vol=cache:{self.cache}")

    def serve_origin(self):
        return b.Strata(self.ctx, self.sock, f"origin={self.origin_spec}")

    def serve_fast(self):
        return b.Strata(self.ctx, self.sock, f"fast={self.cache}?ro")

    def zipf_args(self, uri, seconds, rw="randread", log_prefix=None, iolog_prefix=None, extra=()):
        """Two jobs, each on its own half of [0, D)."""
        args = ["--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k", "--iodepth=8",
                "--random_distribution=zipf:1.2", f"--runtime={int(seconds * 1000)}ms", "--time_based",
                f"--size={b.fio_size(self.region)}", *extra]
        if rw == "randrw":
            args.append("--rwmixread=50")
        if log_prefix:
            args += [f"--write_iops_log={log_prefix}", "--log_avg_msec=500"]
        for j in range(2):
            args += [f"--name=job{j + 1}", f"--offset={b.fio_size(j * self.region)}"]
            if iolog_prefix:
                args.append(f"--write_iolog={iolog_prefix}.{j + 1}")
        return args

    def run_zipf(self, uri, seconds, rw="randread", server=None, volume="vol", iolog_prefix=None, extra=()):
        """Runs the two zipf jobs (with `extra` fio options); returns (fio report, [(t_s, iops)], status rows, counters of
        this run alone)."""
        prefix = self.work / f"iops-{time.time_ns()}"
        poller = b.StatusPoller(server, volume).start() if server is not None and server.admin else None
        try:
            rep = b.fio(self.zipf_args(uri, seconds, rw, log_prefix=prefix, iolog_prefix=iolog_prefix, extra=extra),
                        timeout=seconds * 3 + 120)
        finally:
            rows = poller.stop() if poller else []
        series = b.read_iops_logs(prefix, 2)
        for p in Path(prefix).parent.glob(Path(prefix).name + "_iops.*.log"):
            p.unlink()
        return rep, series, rows, (poller.totals() if poller else {})

    def prefill(self, server, offset, length, zipf_seconds=0.0):
        """Promotes [offset, offset+length) into the cache quickly: sequential cutoff and
        migration budget off, one sequential read, settings back. With zipf_seconds, then
        reads the range with the measured workload's shape so its blocks look hot too."""
        before = server.target("vol")
        server.message("vol", "sequential_cutoff 0")
        server.message("vol", "migration_budget 0")
        try:
            b.fio(["--ioengine=nbd", f"--uri={server.uri('vol')}", "--name=fill", "--rw=read", "--bs=64k",
                   "--iodepth=16", f"--offset={b.fio_size(offset)}", f"--size={b.fio_size(length)}"],
                  timeout=3600)
        finally:
            server.message("vol", f"sequential_cutoff {before.get('sequential_cutoff_bytes', 4 << 20)}")
            server.message("vol", f"migration_budget {before.get('migration_budget_bytes_per_s', 32 << 20)}")
        if zipf_seconds > 0:
            half = length // 2
            args = ["--ioengine=nbd", f"--uri={server.uri('vol')}", "--rw=randread", "--bs=4k", "--iodepth=8",
                    "--random_distribution=zipf:1.2", f"--runtime={int(zipf_seconds * 1000)}ms", "--time_based",
                    f"--size={b.fio_size(half)}", "--randseed=4242"]
            for j in range(2):
                args += [f"--name=junk{j + 1}", f"--offset={b.fio_size(offset + j * half)}"]
            b.fio(args, timeout=zipf_seconds * 3 + 120)
        return server.target("vol")


def hit_series(rows):
    """(t_s, hit ratio of the interval) from StatusPoller rows."""
    return [(r["t_s"], r["hit_ratio"]) for r in rows if r.get("hit_ratio") is not None]


def avg_iops(report):
    return b.total_iops(report)
