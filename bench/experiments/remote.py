"""remote: strata's NBD client device and TLS (issue 18's figures). fio --ioengine=nbd
against nbdkit exports with and without strata in front, in one run:

- warm cache: 4 KiB randread zipf:1.2 at iodepth 32 on a strata `cache` (a local file as
  the fast device, as large as the origin) in front of nbdkit's file plugin behind its
  delay filter (2 ms per request), warmed by reading every block once and then the workload
  itself with the promotion budget lifted, against the same local file served by strata directly, and the delayed export
  read by fio directly;
- the client device's own cost: strata serving the delayed export with no cache, against
  fio reading it directly at the same iodepth;
- TLS: 4 KiB randread on a `mem:` volume over TCP, fio (libnbd, GnuTLS) as the TLS client
  with X.509 against the same server without TLS, 3 alternating rounds, with the server's
  CPU per request; and, as a second figure, strata as the TLS client in between (fio ->
  strata -> strata's `mem:` volume, TLS-PSK between the two strata against none);
- sequential 1 MiB reads of an nbdkit export through strata against reading it directly,
  in paired rounds, on the export as nbdkit serves the file (all processes on this
  machine's cores: a CPU figure) and shaped as a network disk (10 Gbit/s, 2 ms per read);
  and the read requests the export sees through strata (count and mean size);
- nbdcopy of a whole export 10% allocated against a dense one, through strata (BLOCK_STATUS
  passed through lets nbdcopy skip the holes), on both exports, in paired rounds;
- recovery: randread through strata while nbdkit is killed and started again 2 s later;
  the time from the restart until the rate is back to 90% of what it was.

Scale 1: a 1 GiB origin, 8 GiB sparse/dense exports, 10 s runs (about 8 minutes).
"""

import os
import re
import subprocess
import threading
import time

import benchlib as b
import plots

NAME = "remote"
TITLE = "Remote origins over NBD: client device, cache in front of a 2 ms export, TLS"


# The exports the sequential and whole-export figures are taken on: as nbdkit serves the
# file, and shaped as a network disk (10 Gbit/s, 2 ms per read: nbdkit's rate is in bits).
SHAPES = [("local export", (), ()),
          ("10 Gbit/s 2 ms export", ("rate", "delay"), ("rate=10G", "rdelay=2ms"))]


def params(scale):
    size_mib = max(64, int(1024 * scale))
    sparse_mib = max(128, int(8192 * scale))
    runtime = max(0.5, round(10 * scale, 1))
    return size_mib, sparse_mib, runtime, 32


def expected_seconds(scale):
    size_mib, sparse_mib, runtime, _ = params(scale)
    return 24 * (runtime + 1) + 6.6 * sparse_mib / 1000 + size_mib / 100 + 20


def run(ctx):
    size_mib, sparse_mib, runtime, iodepth = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    p = ctx.progress
    log = ctx.scratch / "remote-servers.log"
    origin = work / "origin.img"
    local = work / "local.img"
    p.set(step="writing the origin and the local file")
    b.fill_random(origin, size_mib * b.MIB)
    b.fill_random(local, size_mib * b.MIB)
    results = {}
    rounds = range(1, (3 if ctx.scale >= 0.25 else 1) + 1)

    def fio(name, uri, extra, server=None, **how):
        p.set(step=name)
        before = server.cpu() if server else None
        rep = b.fio(["--name=job", "--ioengine=nbd", f"--uri={uri}", f"--runtime={int(runtime * 1000)}ms",
                     "--time_based", f"--size={size_mib}M", *extra], **how)
        side = rep["jobs"][0]["read"]
        r = {"iops": side["iops"], "mib_s": side["bw"] / 1024}
        if server is not None and side["total_ios"]:
            r["server_us_per_req"] = (server.cpu() - before) / side["total_ios"] * 1e6
        results[name] = r
        return r

    zipf = ["--bs=4k", f"--iodepth={iodepth}", "--rw=randread", "--random_distribution=zipf:1.2", "--norandommap"]
    delay = ("delay",)
    with b.nbdkit(work / "k.sock", "file", str(origin), "rdelay=2ms", "wdelay=2ms", filters=delay, log=log) as k:
        fio("nbdkit file with 2 ms delay read directly", k.uri(), zipf)
        remote = f"nbd+unix:///?socket={k.sock}"
        with b.Strata(ctx, work / "s.sock", f"r={remote}", admin=False) as s:
            fio("strata remote (no cache) over the 2 ms export", s.uri("r"), zipf, s)
        cache = work / "c.img"
        b.cache_create(ctx, remote, f"{cache}?size={b.cache_file_bytes(size_mib * b.MIB, 65536)}",
                       block_size="64KiB", mode="writethrough")
        with b.Strata(ctx, work / "s.sock", f"c=cache:{cache}") as s:
            # Warm as a user would: with the promotion budget lifted (32 MiB/s by default, to
            # spare the origin), read the whole data set once (every 64 KiB block, in random
            # order so the sequential cutoff lets it in), then the workload itself; then the
            # budget back to its default for the measured run.
            s.message("c", "migration_budget 0")
            p.set(step="warming the cache: every block once")
            b.fio(["--name=warm", "--ioengine=nbd", f"--uri={s.uri('c')}", "--bs=64k", f"--iodepth={iodepth}",
                   "--rw=randread", f"--size={size_mib}M"])
            for i in range(3 if ctx.scale >= 0.1 else 1):
                fio(f"warming the cache ({i + 1})", s.uri("c"), zipf)
            s.message("c", "migration_budget 32MiB")
            fio("strata cache over the 2 ms export (warm)", s.uri("c"), zipf, s)
            results["strata cache over the 2 ms export (warm)"]["hit_ratio"] = _hit_ratio(s.target("c"))
    with b.Strata(ctx, work / "s.sock", f"l={local}", admin=False) as s:
        fio("strata serving the local file", s.uri("l"), zipf, s)

    # TLS on a mem: volume. fio's libnbd refuses key files named in URIs, so strata is the
    # TLS client: fio -> strata B (plain, Unix socket) -> strata A's mem: volume, with and
    # without TLS between B and A.
    keys = work / "keys.psk"
    b.run(["psktool", "-u", "bench", "-p", str(keys)])
    mem = ["--bs=4k", f"--iodepth={iodepth}", "--rw=randread", "--norandommap"]
    fill = ["--name=fill", "--ioengine=nbd", "--rw=write", "--bs=1M", f"--size={size_mib}M"]
    for label, extra, scheme, opts in [("no TLS", (), "nbd", ""),
                                       ("TLS-PSK", ("--tls", "require", "--tls-psk", str(keys)), "nbds",
                                        f"&tls-psk-file={keys}")]:
        with b.Strata(ctx, work / "a.sock", f"m=mem:{size_mib}MiB", admin=False, extra=extra) as a:
            with b.Strata(ctx, work / "s.sock", f"r={scheme}+unix:///m?socket={a.sock}{opts}", admin=False) as s:
                b.fio(fill + [f"--uri={s.uri('r')}"])
                fio(f"strata mem ({label})", s.uri("r"), mem, a)

    # TLS on a mem: volume with fio as the TLS client (libnbd and GnuTLS, as users connect),
    # against the same server without TLS. libnbd takes X.509 credentials from its default
    # directory only ($HOME/.pki/libnbd, or /etc/pki/libnbd for root), so fio runs with a
    # HOME of the benchmark's own, as an unprivileged user when this runs as root.
    pki, home = work / "pki", work / "home"
    client_dir = home / ".pki" / "libnbd"
    _x509(pki, client_dir)
    for d in (client_dir, client_dir.parent, home, work, ctx.scratch):
        d.chmod(0o755)  # for the unprivileged user fio runs as
    port = b.free_port()
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    tls_on = ("--tcp", f"127.0.0.1:{port}", "--tls", "on", "--tls-certificates", str(pki))
    with b.Strata(ctx, work / "t.sock", f"m=mem:{size_mib}MiB", admin=False, extra=tls_on) as t:
        b.fio(fill + [f"--uri={t.uri('m')}"])
        for rnd in rounds:
            for label, scheme in [("no TLS", "nbd"), ("TLS X.509", "nbds")]:
                fio(f"fio to strata mem over TCP ({label}) round {rnd}", f"{scheme}://localhost:{port}/m", mem, t,
                    prefix=as_user, env={"HOME": str(home)})
    for label in ("no TLS", "TLS X.509"):
        rs = [results[f"fio to strata mem over TCP ({label}) round {rnd}"] for rnd in rounds]
        results[f"fio to strata mem over TCP ({label})"] = {
            m: b.median([r[m] for r in rs if m in r]) for m in ("iops", "mib_s", "server_us_per_req")}

    # Sequential 1 MiB reads, direct and through strata, in paired rounds, on two exports:
    # nbdkit's file plugin as it is, where every process shares this machine's cores and the
    # figure measures CPU (strata copies each byte in from one socket and out to another),
    # and the same file shaped as a network disk (nbdkit's rate and delay filters), where the
    # link sets the pace as it does for a remote origin. Then the requests the export sees
    # when read through strata, counted by nbdkit's stats filter.
    seq = ["--bs=1M", "--iodepth=8", "--rw=read"]
    for shape, filters, args in SHAPES:
        with b.nbdkit(work / "k.sock", "file", str(origin), *args, filters=filters, log=log) as k:
            with b.Strata(ctx, work / "s.sock", f"r=nbd+unix:///?socket={k.sock}", admin=False) as s:
                for rnd in rounds:
                    fio(f"sequential 1 MiB nbdkit read directly ({shape}) round {rnd}", k.uri(), seq)
                    fio(f"sequential 1 MiB through strata ({shape}) round {rnd}", s.uri("r"), seq, s)
    stats = work / "stats.txt"
    with b.nbdkit(work / "k.sock", "file", str(origin), f"statsfile={stats}", filters=("stats",), log=log) as k:
        with b.Strata(ctx, work / "s.sock", f"r=nbd+unix:///?socket={k.sock}", admin=False) as s:
            b.fio(["--name=job", "--ioengine=nbd", f"--uri={s.uri('r')}", f"--size={size_mib}M", *seq])
    origin_reads = _stats_reads(stats)

    # Recovery after a restart of the remote server.
    k = b.nbdkit(work / "k.sock", "file", str(origin), log=log)
    with b.Strata(ctx, work / "s.sock", f"r=nbd+unix:///?socket={k.sock}", admin=False) as s:
        recovery, k2 = _recovery(ctx, work, s, k, origin, runtime, log)
    k2.stop()

    # Whole-export copies: 10% allocated against dense.
    sparse, dense = work / "sparse.img", work / "dense.img"
    p.set(step="writing the sparse and the dense export")
    with open(sparse, "wb") as f:
        f.truncate(sparse_mib * b.MIB)
        chunk = open("/dev/urandom", "rb").read(b.MIB)
        for i in range(0, sparse_mib, 10):
            f.seek(i * b.MIB)
            f.write(chunk)
    b.fill_random(dense, sparse_mib * b.MIB)
    copies = {}
    for shape, filters, args in SHAPES:
        for rnd in rounds:
            for name, path in [("10% allocated", sparse), ("dense", dense)]:
                subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # in the page cache
                with b.nbdkit(work / "k.sock", "file", str(path), *args, filters=filters, log=log) as k:
                    with b.Strata(ctx, work / "s.sock", f"r=nbd+unix:///?socket={k.sock}", admin=False) as s:
                        p.set(step=f"nbdcopy of the {name} export through strata ({shape}) round {rnd}")
                        t = time.time()
                        b.run(["nbdcopy", s.uri("r"), "null:"])
                        copies.setdefault(shape, {}).setdefault(name, []).append(time.time() - t)

    def paired(shape, a, d):
        """The median over rounds of each round's figure a against figure d."""
        return b.median([results[f"{a} ({shape}) round {r}"]["mib_s"] / results[f"{d} ({shape}) round {r}"]["mib_s"]
                         for r in rounds])

    ratios = {
        "warm cache / local file (IOPS)": _ratio(results, "strata cache over the 2 ms export (warm)",
                                                 "strata serving the local file"),
        "strata remote without cache / fio on the export (IOPS)": _ratio(
            results, "strata remote (no cache) over the 2 ms export", "nbdkit file with 2 ms delay read directly"),
        "TLS / no TLS on mem: with fio as the TLS client (IOPS)": _ratio(
            results, "fio to strata mem over TCP (TLS X.509)", "fio to strata mem over TCP (no TLS)"),
        "TLS / no TLS on mem: with strata as the TLS client in between (IOPS)": _ratio(
            results, "strata mem (TLS-PSK)", "strata mem (no TLS)"),
    }
    for shape, _, _ in SHAPES:
        ratios[f"sequential 1 MiB through strata / direct ({shape}) (MiB/s)"] = paired(
            shape, "sequential 1 MiB through strata", "sequential 1 MiB nbdkit read directly")
    for shape, _, _ in SHAPES:
        c = copies[shape]
        ratios[f"copy time 10% allocated / dense ({shape})"] = b.median(
            [s_ / d for s_, d in zip(c["10% allocated"], c["dense"])])
    rows = [{"series": k, **v} for k, v in results.items()]
    fields = ["series", "iops", "mib_s", "server_us_per_req", "hit_ratio"]
    b.write_csv(out / "remote.csv", rows, fields)
    b.write_ratios(out, ratios)
    plots.bar_chart(out / "ratios.png",
                    f"Remote origins: each figure against its peer in the same run ({size_mib} MiB origin, "
                    f"{runtime} s runs, scale {ctx.scale:g}); targets 0.9, 0.95, 0.85, 0.9 and at most 0.15",
                    list(ratios), list(ratios.values()), "ratio", "figure")
    return {
        "setup": {"size_mib": size_mib, "sparse_mib": sparse_mib, "runtime_s": runtime, "iodepth": iodepth},
        "results": results,
        "copies_s": copies,
        "origin_reads_through_strata": origin_reads,
        "recovery": recovery,
        "ratios": ratios,
        "files": ["remote.csv", "ratios.csv", "ratios.png"],
    }


def _ratio(results, a, b_):
    return results[a]["iops"] / results[b_]["iops"]


def _hit_ratio(target):
    hits, misses = target.get("read_hits", 0), target.get("read_misses", 0)
    return hits / (hits + misses) if hits + misses else None


def _recovery(ctx, work, s, k, origin, runtime, log):
    """Randread through strata; nbdkit killed after `runtime` s and started again 2 s later.
    Returns the rate before, and the seconds from the restart until a 0.5 s moving average
    is back to 90% of it."""
    ctx.progress.set(step="recovery after a restart of the remote server")
    prefix = work / "recovery"
    total = 3 * runtime + 2
    args = ["--name=job", "--ioengine=nbd", f"--uri={s.uri('r')}", "--bs=4k", "--iodepth=32", "--rw=randread",
            "--norandommap", f"--runtime={int(total * 1000)}ms", "--time_based", "--size=64M",
            f"--write_iops_log={prefix}", "--log_avg_msec=100"]
    t = threading.Thread(target=lambda: b.fio(args, timeout=total + 300))
    t.start()
    time.sleep(runtime)
    k.p.stop(sig=9)
    killed = runtime
    time.sleep(2)
    k2 = b.nbdkit(k.sock, "file", str(origin), log=log)
    restarted = killed + 2
    t.join()
    series = b.read_iops_logs(prefix, 1, bucket_ms=100)
    before = b.mean([v for (u, v) in series if 1 <= u < killed])
    back = None
    for u, _ in series:
        w = [v for (x, v) in series if u - 0.5 < x <= u]
        if u >= restarted + 0.5 and b.mean(w) >= 0.9 * before:
            back = u - restarted  # the end of the first 0.5 s window at 90%
            break
    return {"iops_before": before, "killed_at_s": killed, "restarted_at_s": restarted,
            "seconds_to_90pct_after_restart": back}, k2


def _stats_reads(path):
    """The read requests nbdkit's stats filter counted: how many, and their mean size."""
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for line in path.read_text().splitlines():
        m = re.match(r"read: (\d+) ops, [\d.]+ s, ([\d.]+) (\w+)", line.strip())
        if m:
            ops, size = int(m[1]), float(m[2]) * units[m[3]]
            return {"requests": ops, "mean_bytes": size / ops if ops else None}
    raise RuntimeError(f"no read line in nbdkit's stats: {path.read_text()!r}")


def _x509(pki, client_dir):
    """A certificate authority and a server certificate for `localhost` in `pki` (the layout
    `--tls-certificates` reads), the authority's certificate in `client_dir` too."""
    pki.mkdir(parents=True, exist_ok=True)
    client_dir.mkdir(parents=True, exist_ok=True)

    def ossl(*args):
        b.run(["openssl", *args], cwd=pki)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca-cert.pem",
         "-subj", "/CN=strata bench CA", "-days", "2")
    (pki / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server-key.pem", "-out", "server.csr",
         "-subj", "/CN=localhost")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
         "-out", "server-cert.pem", "-days", "2", "-extfile", "ext.cnf")
    (client_dir / "ca-cert.pem").write_bytes((pki / "ca-cert.pem").read_bytes())

