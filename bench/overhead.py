#!/usr/bin/env python3
"""The NBD data path against its peers: fio --ioengine=nbd, 4 KiB, iodepth 32, against
strata and nbdkit on the same backing, plus fio directly on the file (io_uring, O_DIRECT)
as the limit. Rounds alternate the servers so drift on a shared machine hits all of them.

    bench/overhead.py [--size 1GiB] [--runtime 10] [--rounds 3] [--out DIR]

Writes DIR/overhead.json and prints a Markdown table (IOPS, ratio to the peer, server CPU
microseconds per request).
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import benchlib as b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iodepth", type=int, default=32)
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir under /var/tmp)")
    a = ap.parse_args()
    b.need("fio", "nbdkit")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="strata-overhead-", dir=a.dir or "/var/tmp"))
    img = work / "backing.img"
    size_mib = int(subprocess.check_output(["numfmt", "--from=iec", a.size.replace("iB", "")]).strip()) >> 20
    subprocess.run(["dd", "if=/dev/urandom", f"of={img}", "bs=1M", f"count={size_mib}", "status=none"], check=True)

    def warm():
        # Same page-cache state for every buffered run: the whole file cached.
        subprocess.run(["cat", str(img)], stdout=subprocess.DEVNULL, check=True)

    common = ["--name=job", "--bs=4k", f"--iodepth={a.iodepth}", f"--runtime={a.runtime}", "--time_based",
              f"--size={size_mib}M", "--randrepeat=0", "--norandommap"]
    results = {}

    def record(name, rw, report, server_cpu):
        side = b.job_side(report, rw)
        ios = side["total_ios"] if "total_ios" in side else side["io_bytes"] // 4096
        job = report["jobs"][0]
        runtime_s = job["elapsed"] if job.get("elapsed") else a.runtime
        client_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime_s
        r = results.setdefault(f"{name} {rw}", {"iops": [], "server_us_per_req": [], "client_us_per_req": []})
        r["iops"].append(side["iops"])
        if server_cpu is not None and ios:
            r["server_us_per_req"].append(server_cpu / ios * 1e6)
        if ios:
            r["client_us_per_req"].append(client_cpu / ios * 1e6)

    def run_nbd(server, name, export, rw):
        warm()
        before = server.cpu()
        rep = b.fio(common + ["--ioengine=nbd", f"--uri={server.uri(export)}", f"--rw={rw}"])
        record(name, rw, rep, server.cpu() - before)

    for rnd in range(a.rounds):
        print(f"round {rnd + 1}/{a.rounds}", flush=True)
        for rw in ["randread", "randwrite"]:
            with b.strata(work / "s.sock", f"buffered={img}?direct=off", f"direct={img}", f"mem=mem:{size_mib}MiB") as s:
                run_nbd(s, "strata file (page cache)", "buffered", rw)
                run_nbd(s, "strata file (O_DIRECT)", "direct", rw)
                # Fill the RAM volume first so reads hit real memory, as nbdkit's does below.
                if rw == "randread":
                    b.fio(["--name=fill", "--ioengine=nbd", f"--uri={s.uri('mem')}", "--rw=write", "--bs=1M",
                           f"--size={size_mib}M"])
                run_nbd(s, "strata mem", "mem", rw)
            with b.nbdkit(work / "k.sock", "file", str(img)) as k:
                run_nbd(k, "nbdkit file", "", rw)
            with b.nbdkit(work / "k.sock", "memory", f"{size_mib}M") as k:
                if rw == "randread":
                    b.fio(["--name=fill", "--ioengine=nbd", f"--uri={k.uri()}", "--rw=write", "--bs=1M",
                           f"--size={size_mib}M"])
                run_nbd(k, "nbdkit memory", "", rw)
            warm()
            rep = b.fio(common + ["--ioengine=io_uring", "--direct=1", f"--filename={img}", f"--rw={rw}"])
            record("fio io_uring O_DIRECT on the file", rw, rep, None)
            warm()
            rep = b.fio(common + ["--ioengine=io_uring", "--direct=0", f"--filename={img}", f"--rw={rw}"])
            record("fio io_uring buffered on the file", rw, rep, None)

    summary = {k: {m: b.median(v) for m, v in r.items()} | {"rounds": r["iops"]} for k, r in results.items()}
    ratios = {}
    for rw in ["randread", "randwrite"]:
        ratios[f"file page cache {rw}: strata / nbdkit file"] = (
            summary[f"strata file (page cache) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / nbdkit file"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / fio direct"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"fio io_uring O_DIRECT on the file {rw}"]["iops"])
        ratios[f"mem {rw}: strata / nbdkit memory"] = (
            summary[f"strata mem {rw}"]["iops"] / summary[f"nbdkit memory {rw}"]["iops"])
    doc = {"size": a.size, "runtime_s": a.runtime, "rounds": a.rounds, "iodepth": a.iodepth,
           "results": summary, "ratios": ratios}
    (out / "overhead.json").write_text(json.dumps(doc, indent=2))

    print(f"\n| series | IOPS (median of {a.rounds}) | server CPU µs/req | client CPU µs/req |")
    print("| --- | ---: | ---: | ---: |")
    for k, r in summary.items():
        srv = f"{r['server_us_per_req']:.1f}" if r["server_us_per_req"] == r["server_us_per_req"] else "—"
        print(f"| {k} | {r['iops']:,.0f} | {srv} | {r['client_us_per_req']:.1f} |")
    print("\n| ratio | value |\n| --- | ---: |")
    for k, v in ratios.items():
        print(f"| {k} | {v:.2f}× |")
    subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
