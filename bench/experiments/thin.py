"""thin: thin volumes against the raw file their pool's data lives in (issue 16's
performance figures). One data file; first served raw by strata, then as the data device
of a thin pool (64 KiB blocks). fio --ioengine=nbd, 4 KiB, iodepth 32 for the plain rows;
fio's nbd engine sends no FUA, so the sync rows (FUA on every write) and the first-write
rows (each 64 KiB block written once, in random order) use `strata load` (32 connections,
one request in flight each), against the raw file too.

Rows: the seed's table (randwrite, randwrite sync, randrw 50/50 and sync, randread) on the
raw file, a fully mapped volume and empty volumes (a fresh one for each write row); first
writes into an empty volume with zeroing, without, on the raw file and on a qcow2 image
served by qemu-nbd (O_DIRECT, as strata's file); writes to blocks shared with one snapshot
and with 100 snapshots against the same writes to unshared blocks; the time of `strata thin
snapshot` on the mapped volume.

The disk's rate swings from minute to minute, so every ratio is taken from runs made next
to each other, over 5 rounds, and the median ratio is kept: the raw file and the mapped
volume run row by row, in turn (which goes first alternates from round to round); each
round of copy-on-write writes every block of volume 1 once unshared, once after one
snapshot and once after 100 (the snapshots deleted after each), in an order that rotates,
and then fio measures the disk's own rate of 64 KiB random reads and writes half and half
(a copy is one of each) on a file beside the data file. The table's IOPS are the medians of
the rounds.

Scale 1: a 2 GiB data file, 512 MiB volumes, 10 s runs (about 15 minutes).
"""

import json
import time

import benchlib as b
import plots

NAME = "thin"
TITLE = "thin volumes vs the raw file (provisioning, FUA fast path, copy-on-write)"
TABLE = ["randwrite", "randwrite sync", "randrw", "randrw sync", "randread"]
SERIES = ["raw file", "thin mapped", "thin unmapped"]
BLOCK = 64 * b.KIB
SNAPSHOTS = 100
ROUNDS = 5


def params(scale):
    data_mib = max(64, int(2048 * scale))
    runtime = max(0.5, round(10 * scale, 1))
    return data_mib, data_mib // 4, runtime


def expected_seconds(scale):
    data_mib, vol_mib, runtime = params(scale)
    rounds = ROUNDS if scale >= 0.25 else 1
    return ((14 + 10 * rounds) * (runtime + 1) + data_mib / 150 + vol_mib / 100 + rounds * SNAPSHOTS * 0.1
            + rounds * (max(0.5, runtime / 5) + 1))


def run(ctx):
    data_mib, vol_mib, runtime = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    data, meta, qcow = work / "data.img", work / "pool.meta", work / "vol.qcow2"
    sock = work / "s.sock"
    vol = vol_mib * b.MIB
    p = ctx.progress
    p.set(step="writing the data file")
    b.fill_random(data, data_mib * b.MIB)
    results = {}

    def fio(server, export, rw, size=vol):
        p.set(step=f"fio {rw} on {export}")
        args = ["--name=job", "--ioengine=nbd", f"--uri={server.uri(export)}", "--bs=4k", "--iodepth=32",
                f"--runtime={int(runtime * 1000)}ms", "--time_based", f"--size={size}", "--randrepeat=0",
                "--norandommap", f"--rw={rw}"]
        if rw == "randrw":
            args.append("--rwmixread=50")
        j = b.fio(args)["jobs"][0]
        return {"read_iops": j["read"]["iops"], "write_iops": j["write"]["iops"]}

    def load(export, rw, fua=False, stride=None, sock=sock):
        p.set(step=f"strata load {rw}{' fua' if fua else ''} on {export or 'qemu-nbd'}")
        argv = [ctx.strata, "load", "--unix", sock, "--export", export, "--rw", rw, "--seconds", str(runtime),
                "--iodepth", "32", "--bs", "4KiB", "--size", str(vol)]
        argv += ["--fua"] if fua else []
        argv += ["--stride", str(stride)] if stride else []
        return json.loads(b.run(argv).stdout.strip().splitlines()[-1])

    def table_row(row, server, export):
        rw, sync = row.split(" ")[0], row.endswith("sync")
        return load(export, rw, fua=True) if sync else fio(server, export, rw)

    # The raw file.
    with b.Strata(ctx, sock, f"raw={data}", admin=False) as s:
        results[("raw file", "first writes")] = load("raw", "randwrite", stride=BLOCK)

    # qcow2 served by qemu-nbd: first writes allocate its clusters (64 KiB).
    qemu = b.which("qemu-nbd") and b.which("qemu-img")
    if qemu:
        b.run(["qemu-img", "create", "-q", "-f", "qcow2", str(qcow), str(vol)])
        qsock = work / "q.sock"
        argv = ["qemu-nbd", "-k", str(qsock), "-f", "qcow2", "--cache=none", "--aio=threads", "-e", "64", "-x", "q",
                str(qcow)]
        with b.Server(argv, qsock, log=ctx.scratch / "qemu-nbd.log"):
            results[("qcow2 (qemu-nbd)", "first writes")] = load("q", "randwrite", stride=BLOCK, sock=qsock)

    # The pool over the same file.
    def thin(*args):
        return b.run([ctx.strata, "thin", *[str(a) for a in args]]).stdout

    thin("pool", "create", "--metadata", f"{meta}?size=256MiB", "--data", data, "--block-size", "64KiB", "--force")
    thin("create", meta, 1, "--size", vol)
    spec = lambda i, extra="": f"thin:{meta}?id={i}{extra}"  # noqa: E731
    next_id = [100]

    def fresh_server(extra=""):
        """A server of a new empty volume `e` (the one before deleted), volume 1 as `vol`."""
        i = next_id[0]
        next_id[0] += 1
        if i > 100:
            thin("delete", meta, i - 1)
        thin("create", meta, i, "--size", vol)
        return b.Strata(ctx, sock, f"vol={spec(1, extra)}", f"e={spec(i, extra)}", admin=False)

    servers = []
    n_rounds = ROUNDS if ctx.scale >= 0.25 else 1
    rounds = {}  # (series, row): one result per round

    def fresh():
        if servers:
            servers.pop().stop()
        servers.append(fresh_server())
        return servers[-1], "e"

    try:
        s = fresh()[0]
        p.set(step="mapping every block of volume 1")
        b.fio(["--name=fill", "--ioengine=nbd", f"--uri={s.uri('vol')}", "--rw=write", "--bs=1M", "--iodepth=4",
               f"--size={vol}"])
        results[("thin zeroing", "first writes")] = load("e", "randwrite", stride=BLOCK)
        servers.pop().stop()
        # The raw file and the mapped volume row by row, next to each other, in rounds.
        for rnd in range(n_rounds):
            for row in TABLE:
                pair = {}
                for series in (("raw file", "thin mapped") if rnd % 2 == 0 else ("thin mapped", "raw file")):
                    spec_, export = (str(data), "raw") if series == "raw file" else (spec(1), "vol")
                    with b.Strata(ctx, sock, f"{export}={spec_}", admin=False) as srv:
                        pair[series] = table_row(row, srv, export)
                for series, r in pair.items():
                    rounds.setdefault((series, row), []).append(r)
        # Empty volumes: a fresh one for each row.
        for row in TABLE:
            s, e = fresh()
            results[("thin unmapped", row)] = table_row(row, s, e)
        servers.pop().stop()
        with fresh_server("&skip_block_zeroing=1"):
            results[("thin no zeroing", "first writes")] = load("e", "randwrite", stride=BLOCK)
    finally:
        for s in servers:
            s.stop()
    thin("delete", meta, next_id[0] - 1)

    # Copy-on-write: each round writes every block of volume 1 once unshared, once after one
    # snapshot and once after 100, the snapshots deleted after each pass (so every block of
    # volume 1 is its own again), in an order that rotates from round to round.
    p.set(step="snapshots")
    t0 = time.time()
    thin("snapshot", meta, 1, 2)
    snapshot_s = time.time() - t0
    thin("delete", meta, 2)
    # Sharing is decided by time, as in dm-thin: each block's next write still copies after
    # the snapshot's deletion. One pass, not measured, so the first round's unshared pass
    # starts where every later one does, with blocks the volume owns alone.
    with b.Strata(ctx, sock, f"vol={spec(1)}", admin=False):
        load("vol", "randwrite", stride=BLOCK)
    probe = work / "disk.img"
    b.fill_random(probe, vol)
    passes = [("thin mapped", 0), ("thin 1 snapshot", 1), (f"thin {SNAPSHOTS} snapshots", SNAPSHOTS)]
    for rnd in range(n_rounds):
        for series, n in passes[rnd % 3:] + passes[:rnd % 3]:
            p.set(step=f"copy-on-write round {rnd + 1}: {series}")
            for i in range(2, n + 2):
                thin("snapshot", meta, 1, i)
            with b.Strata(ctx, sock, f"vol={spec(1)}", admin=False):
                rounds.setdefault((series, "overwrites"), []).append(load("vol", "randwrite", stride=BLOCK))
            for i in range(2, n + 2):
                thin("delete", meta, i)
        # The disk's own ceiling for copies: fio on a file beside the data file, 64 KiB
        # random reads and writes half and half at the same depth (a copy is one of each).
        p.set(step=f"copy-on-write round {rnd + 1}: the disk's 64 KiB reads and writes")
        j = b.fio(["--name=disk", f"--filename={probe}", "--direct=1", "--ioengine=io_uring", "--bs=64k",
                   "--iodepth=32", "--rw=randrw", "--rwmixread=50", f"--size={vol}", "--time_based",
                   f"--runtime={int(max(0.5, runtime / 5) * 1000)}ms"])["jobs"][0]
        rounds.setdefault(("disk 64 KiB", "randrw"), []).append(
            {"read_iops": j["read"]["iops"], "write_iops": j["write"]["iops"]})
    thin("snapshot", meta, 1, 2)  # the pool checked and listed below holds a snapshot
    listing = thin("list", meta)
    check = b.run([ctx.strata, "thin", "check", meta], check=False)

    def total(r):
        return r["read_iops"] + r["write_iops"]

    for k, rs in rounds.items():
        results[k] = {m: b.median([r[m] for r in rs]) for m in ("read_iops", "write_iops")}

    def iops(series, row):
        r = results.get((series, row))
        return None if r is None else total(r)

    def ratio(a, c):
        return None if not a or not c else a / c

    def paired(series, base, row, base_row=None):
        """The median over the rounds of `series` against `base` (in `base_row`, if another)
        in the same round."""
        xs, ys = rounds.get((series, row)), rounds.get((base, base_row or row))
        return b.median([total(x) / total(y) for x, y in zip(xs, ys) if total(y)]) if xs and ys else None

    # Copies a second against the disk's 64 KiB read+write pairs a second (a copy is one of each).
    per_pair = paired("thin 1 snapshot", "disk 64 KiB", "overwrites", base_row="randrw")

    fw = "first writes"
    ratios = {
        "mapped randwrite / raw": paired("thin mapped", "raw file", "randwrite"),
        "mapped randwrite FUA / raw FUA": paired("thin mapped", "raw file", "randwrite sync"),
        "mapped randread / raw": paired("thin mapped", "raw file", "randread"),
        "mapped randrw / raw": paired("thin mapped", "raw file", "randrw"),
        "mapped randrw FUA / raw FUA": paired("thin mapped", "raw file", "randrw sync"),
        "first writes zeroing / raw": ratio(iops("thin zeroing", fw), iops("raw file", fw)),
        "first writes zeroing / qcow2": ratio(iops("thin zeroing", fw), iops("qcow2 (qemu-nbd)", fw)),
        "first writes no zeroing / raw": ratio(iops("thin no zeroing", fw), iops("raw file", fw)),
        "shared (1 snapshot) / unshared overwrites": paired("thin 1 snapshot", "thin mapped", "overwrites"),
        "100 snapshots / 1 snapshot": paired(f"thin {SNAPSHOTS} snapshots", "thin 1 snapshot", "overwrites"),
        "shared (1 snapshot) / the disk's 64 KiB read+write pairs": None if per_pair is None else 2 * per_pair,
    }

    rows = [{"series": s, "row": r, "read_iops": v["read_iops"], "write_iops": v["write_iops"]}
            for (s, r), v in results.items()]
    b.write_csv(out / "thin.csv", rows, ["series", "row", "read_iops", "write_iops"])
    b.write_ratios(out, ratios)
    values = {(None, r, s): iops(s, r) for s in SERIES for r in TABLE}
    plots.grouped_bars(out / "table.png",
                       f"4 KiB random IO, iodepth 32, {vol_mib} MiB volumes over a {data_mib} MiB data file, "
                       f"{runtime} s runs (sync: FUA on every write, strata load); higher is better",
                       TABLE, SERIES, values, "IOPS (reads + writes)", "workload")
    return {
        "setup": {"data_mib": data_mib, "volume_mib": vol_mib, "runtime_s": runtime, "block_bytes": BLOCK,
                  "snapshots": SNAPSHOTS},
        "results": {f"{s}: {r}": v for (s, r), v in results.items()},
        "ratios": ratios,
        "rounds": {f"{s}: {r}": [total(x) for x in v] for (s, r), v in rounds.items()},
        "snapshot_seconds": snapshot_s,
        "thin_list": listing,
        "thin_check_ok": check.returncode == 0,
        "files": ["thin.csv", "ratios.csv", "table.png"],
    }
