"""git (seed 003's git extract test): ext4 on the cached volume through nbdfuse + a loop
device, made without discard; a large git repository is cloned onto it (a write load as
far as the cache is concerned), the file system is remounted cold, and 20 tags are checked
out one after another (reads of what was written, and writes), each followed by a sync
(the seed's repository was large enough to go past the kernel's dirty limits; here the
page cache would otherwise hold all of it until the end). Each phase is timed with its
syncs. Rows, all in one run: the hdd: origin alone; the fast device alone (the volume as a
plain file on the file system that holds the cache files: the seed's "raw NVMe"); and, for
a sweep of fast device sizes from far below to above the working set, strata's `cache`
(writeback, 64 KiB blocks) and `writecache` (the write log, 4 KiB blocks, default
tunables), each over the same origin. Every fast file is written through first (a device has
no holes).

The repository is generated deterministically here (git fast-import from a seeded PRNG):
thousands of small files in nested folders, commits that each rewrite a part of a
thousand files or so and add or remove some, and 20 tags spread over the history. The
working set is reported as the repository's size on disk after the clone and the bytes
the clone and the checkouts write.

Scale 1: 30,000 files, 200 commits of 1,200 files each, 20 tags; a 2 GiB volume; fast
devices of 32, 256, 1024 and 2048 MiB (the last holds the whole volume).
Needs root, /dev/fuse, a free loop device, nbdfuse, mkfs.ext4 and git; skipped otherwise.

    GIT_CACHES_MIB=32,256 picks the fast device sizes and GIT_TARGETS=writecache the targets
    (default: the sizes above, both targets); the two devices alone always run.
"""

import os
import random
import time
from pathlib import Path

import benchlib as b
import plots

NAME = "git"
TITLE = "git clone + checkout of 20 tags on ext4 over the cached volume"
BLOCK = 64 * b.KIB
WRITECACHE_BLOCK = 4 * b.KIB
TAGS = 20
TOOLS = ["nbdfuse", "losetup", "mkfs.ext4", "mount", "umount", "fusermount3", "git", "sync"]
ORIGIN = "origin alone"
FAST = "fast alone"
TARGETS = ["cache", "writecache"]
COLORS = {"cache": "#1f77b4", "writecache": "#d62728"}


def params(scale):
    files = max(200, int(30000 * scale))
    commits = max(TAGS, int(200 * scale))
    vol = max(128, int(2048 * scale)) * b.MIB
    caches = [max(4, int(c * scale)) for c in (32, 256, 1024, 2048)] if scale >= 0.25 else [8]
    if os.environ.get("GIT_CACHES_MIB"):
        caches = [int(c) for c in os.environ["GIT_CACHES_MIB"].split(",") if c.strip()]
    return files, commits, vol, [c * b.MIB for c in caches]


def targets():
    chosen = [t.strip() for t in os.environ.get("GIT_TARGETS", ",".join(TARGETS)).split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TARGETS]
    if unknown:
        raise ValueError(f"GIT_TARGETS: unknown {', '.join(unknown)} (known: {', '.join(TARGETS)})")
    return chosen


def per_commit(files):
    """Files rewritten by each commit after the first."""
    return max(3, files // 25)


def expected_seconds(scale):
    files, commits, vol, caches = params(scale)
    blobs = files + commits * per_commit(files)
    per_run = 4 + blobs / 4000 + vol / (60 * b.MIB)
    return (len(targets()) * len(caches) + 2) * per_run + blobs / 2500


def skipped(ctx, name, tools=TOOLS):
    """The summary of an experiment that cannot run here (and a note saying why), or None."""
    why = unavailable(tools)
    if why:
        ctx.progress.note(f"  {name}: SKIPPED: {why}")
        return {"skipped": why}
    return None


def unavailable(tools=TOOLS):
    if os.geteuid() != 0:
        return "needs root (losetup, mount)"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if not Path("/dev/loop-control").exists():
        return "/dev/loop-control is missing (no loop devices)"
    missing = [t for t in tools if b.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (see scripts/setup.sh)"
    return None


# ---------------------------------------------------------------------- the repository

WORDS = ("block cache origin policy promote demote dirty clean write back flush commit mapping slot "
         "queue level hot cold junk zipf seek rotate sector extent journal inode bitmap superblock "
         "checksum sequence replay recover crash durable barrier request reply cookie handshake export "
         "volume target device stream cutoff budget share idle busy tick window ratio miss hit fn let "
         "mut impl struct enum match return async await self pub use mod const static loop while for "
         "if else break continue true false none some ok err result option vec map set").split()


def _text(rng, lines):
    return "".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + "\n" for _ in range(lines))


def generate_repo(dest, files, commits, seed=5):
    """A bare repository at `dest` with `commits` commits on main and tags v01..v20."""
    rng = random.Random(seed)
    b.run(["git", "init", "-q", "--bare", "-b", "main", dest])
    dirs = [f"src/m{i:02d}/s{j}" for i in range(max(2, files // 150)) for j in range(3)]
    paths = [f"{rng.choice(dirs)}/f{i:05d}.rs" for i in range(files)]
    content = {p: _text(rng, rng.randint(5, 60)) for p in paths}
    tag_at = {round(commits * (k + 1) / TAGS): f"v{k + 1:02d}" for k in range(TAGS)}
    chunks = []
    mark = 0
    next_file = files

    def blob(data):
        nonlocal mark
        mark += 1
        raw = data.encode()
        chunks.append(b"blob\nmark :%d\ndata %d\n" % (mark, len(raw)) + raw + b"\n")
        return mark

    for c in range(1, commits + 1):
        changes = []
        if c == 1:
            touched = list(content)
        else:
            touched = rng.sample(sorted(content), k=min(len(content), per_commit(files)))
            for p in touched:
                lines = content[p].splitlines(keepends=True)
                for _ in range(rng.randint(1, 6)):
                    i = rng.randrange(len(lines) + 1)
                    if rng.random() < 0.3 and lines:
                        del lines[min(i, len(lines) - 1)]
                    else:
                        lines.insert(i, _text(rng, rng.randint(1, 8)))
                content[p] = "".join(lines) or _text(rng, 5)
            for _ in range(rng.randint(0, 3)):  # new files
                p = f"{rng.choice(dirs)}/f{next_file:05d}.rs"
                next_file += 1
                content[p] = _text(rng, rng.randint(5, 60))
                touched.append(p)
            for p in rng.sample(sorted(content), k=rng.randint(0, 2)):  # removals
                if p not in touched:
                    del content[p]
                    changes.append(b"D %s\n" % p.encode())
        for p in touched:
            changes.append(b"M 100644 :%d %s\n" % (blob(content[p]), p.encode()))
        msg = f"commit {c}: {len(touched)} files\n".encode()
        when = 1700000000 + c * 3600
        chunks.append(b"commit refs/heads/main\nmark :%d\ncommitter Bench <bench@strata> %d +0000\ndata %d\n%s"
                      % (100000000 + c, when, len(msg), msg))
        if c > 1:
            chunks.append(b"from :%d\n" % (100000000 + c - 1))
        chunks.extend(changes)
        chunks.append(b"\n")
        if c in tag_at:
            tmsg = f"tag {tag_at[c]}\n".encode()
            chunks.append(b"tag %s\nfrom :%d\ntagger Bench <bench@strata> %d +0000\ndata %d\n%s\n"
                          % (tag_at[c].encode(), 100000000 + c, when, len(tmsg), tmsg))
    stream = b"".join(chunks)
    del chunks
    b.run(["git", "-C", dest, "fast-import", "--quiet"], input=stream.decode(), timeout=1800)
    b.run(["git", "-C", dest, "repack", "-adq"], timeout=1800)
    return sorted(tag_at.values())


# ------------------------------------------------------------------- the mounted volume

class FuseLoop:
    """nbdfuse on an NBD export, a loop device on its file, ext4 mounted on the loop
    device; close() undoes whatever of it was done (also from benchlib.cleanup())."""

    def __init__(self, ctx, uri, work):
        self.ctx, self.work = ctx, work
        self.fuse_dir = work / "fuse"
        self.mnt = work / "mnt"
        self.fuse_dir.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        self.dev = None
        self.mounted = False
        b.on_cleanup(self.close)
        self.fuse = b.Proc(["nbdfuse", self.fuse_dir, uri], log=ctx.scratch / "nbdfuse.log")
        deadline = time.time() + 20
        while not (self.fuse_dir / "nbd").exists():
            if not self.fuse.alive():
                raise RuntimeError(f"nbdfuse exited: {self.fuse.log_tail()}")
            if time.time() > deadline:
                raise RuntimeError("nbdfuse did not create its file within 20 s")
            time.sleep(0.05)

    def make_ext4(self):
        """A loop device on the export, ext4 made on it (no discard, its tables written now),
        mounted."""
        self.attach()
        b.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", self.dev],
              timeout=1800)
        self.mount()

    def remount_cold(self, drop_caches=False):
        """Unmounted, a fresh loop device, mounted again; with `drop_caches`, the page cache
        (the FUSE file's pages too) dropped in between."""
        self.umount()
        self.detach()
        if drop_caches:
            b.run(["sync"], timeout=600)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        self.attach()
        self.mount()

    def attach(self):
        self.dev = b.run(["losetup", "--find", "--show", "--direct-io=off", self.fuse_dir / "nbd"],
                         timeout=30).stdout.strip()

    def mount(self):
        b.run(["mount", "-t", "ext4", self.dev, self.mnt], timeout=60)
        self.mounted = True

    def umount(self):
        if self.mounted:
            r = b.run(["umount", self.mnt], timeout=120, check=False)
            if r.returncode != 0:
                b.run(["umount", "-l", self.mnt], timeout=30, check=False)
            self.mounted = False

    def detach(self):
        if self.dev:
            b.run(["losetup", "-d", self.dev], timeout=30, check=False)
            self.dev = None

    def close(self):
        self.umount()
        self.detach()
        if self.fuse is not None:
            if self.fuse.alive():
                r = b.run(["fusermount3", "-u", self.fuse_dir], timeout=30, check=False)
                if r.returncode != 0:
                    b.run(["fusermount3", "-uz", self.fuse_dir], timeout=30, check=False)
            self.fuse.stop(timeout=20)
            self.fuse = None


def io_counts(server):
    """Requests and bytes the volume has seen so far, by read and write."""
    v = next(v for v in server.status()["volumes"] if v["name"] == "vol")
    return {f"{op}_{k}": v["ops"][op][k] for op in ("read", "write") for k in ("requests", "bytes")}


def target_figures(server, spec):
    """The target's counters at the end of a run, under the CSV's names."""
    if spec.startswith("cache:"):
        t = server.target("vol")
        return {"hit_ratio": t.get("hit_ratio_total"), "promotions": t.get("promotions"),
                "dirty_blocks_end": t.get("dirty_blocks"), "bypassed": t.get("bypassed")}
    if spec.startswith("writecache:"):
        t = server.target("vol")
        reads = t["read_hits"] + t["read_misses"]
        return {"hit_ratio": t["read_hits"] / reads if reads else None, "writes_around": t["writes_around"],
                "dirty_blocks_end": t["dirty_blocks"], "writebacks": t["writebacks"],
                "write_hits": t["write_hits"], "writes_around_partial": t.get("writes_around_partial"),
                "writes_around_writebacks": t.get("writes_around_writebacks"),
                "writes_around_superseded": t.get("writes_around_superseded")}
    return {}


def one_run(ctx, label, spec, src, tags, work):
    """mkfs, clone (timed), cold remount, checkout of every tag (timed) on `spec`."""
    p = ctx.progress
    sock = work / "s.sock"
    r = {"config": label}
    with b.Strata(ctx, sock, f"vol={spec}") as s:
        fl = FuseLoop(ctx, s.uri("vol"), work)
        try:
            p.set(step=f"{label}: mkfs.ext4")
            fl.make_ext4()
            c0 = io_counts(s)
            p.set(step=f"{label}: git clone")
            t0 = time.time()
            b.run(["git", "clone", "-q", "--no-hardlinks", src, fl.mnt / "repo"], timeout=3600)
            b.run(["sync", "-f", fl.mnt / "repo"], timeout=3600)
            r["clone_s"] = time.time() - t0
            c1 = io_counts(s)
            r["repo_disk_bytes"] = int(b.run(["du", "-sb", fl.mnt / "repo"], timeout=600).stdout.split()[0])
            # Cold caches for the checkout phase: unmount, fresh loop device, mount again.
            fl.remount_cold()
            c2 = io_counts(s)
            t0 = time.time()
            for i, tag in enumerate(tags):
                p.set(step=f"{label}: git checkout {tag} ({i + 1}/{len(tags)})")
                b.run(["git", "-C", fl.mnt / "repo", "checkout", "-q", tag], timeout=3600)
                b.run(["sync", "-f", fl.mnt / "repo"], timeout=3600)
            r["checkout_s"] = time.time() - t0
            c3 = io_counts(s)
            r |= {f"clone_{k}": c1[k] - c0[k] for k in c0} | {f"checkout_{k}": c3[k] - c2[k] for k in c2}
            r |= target_figures(s, spec)
        finally:
            fl.close()
    return r


def run(ctx):
    if skip := skipped(ctx, NAME):
        return skip
    files, commits, vol, caches = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    p = ctx.progress
    p.set(step=f"generating a repository: {files} files, {commits} commits, {TAGS} tags")
    src = work / "src.git"
    tags = generate_repo(src, files, commits)
    pack_bytes = sum(f.stat().st_size for f in (src / "objects" / "pack").iterdir())
    origin = work / "origin.img"
    cachef = work / "cache.img"
    chosen = targets()
    rows = []

    def done(row):
        rows.append(row)
        p.note(f"  {NAME}: {row['config']}: clone {row['clone_s']:.1f} s, checkout {row['checkout_s']:.1f} s")

    p.set(step="writing the origin")
    b.fill_random(origin, vol)
    done(one_run(ctx, ORIGIN, f"hdd:{origin}", src, tags, work) | {"target": ORIGIN})
    fast = work / "fast.img"
    b.fill_random(fast, vol)
    done(one_run(ctx, FAST, str(fast), src, tags, work) | {"target": FAST})
    fast.unlink()
    for c in caches:
        for target in chosen:
            block, create = (BLOCK, b.cache_create) if target == "cache" else (WRITECACHE_BLOCK, b.writecache_create)
            # Written through before the target is made, as the fast device alone: a device
            # has no holes, and first writes into a sparse file cost the host file system
            # block allocations (the write log's clone took 1.2-1.4x as long on one).
            b.fill_random(cachef, b.cache_file_bytes(c, block))
            create(ctx, f"hdd:{origin}", str(cachef))
            label = f"strata {target} {c // b.MIB} MiB"
            done(one_run(ctx, label, f"{target}:{cachef}", src, tags, work)
                 | {"target": target, "cache_mib": c // b.MIB})

    b.write_csv(out / "times.csv", rows, ["config", "target", "cache_mib", "clone_s", "checkout_s", "hit_ratio",
                                          "promotions", "bypassed", "writes_around", "writes_around_partial",
                                          "writes_around_writebacks", "writes_around_superseded", "writebacks",
                                          "write_hits",
                                          "dirty_blocks_end", "repo_disk_bytes", "clone_write_bytes",
                                          "clone_read_bytes", "checkout_read_bytes", "checkout_write_bytes",
                                          "checkout_read_requests", "checkout_write_requests"])
    # The seed's table: one group per fast device size (and the two devices alone), one bar
    # per target, a panel per phase.
    phases = [("clone", "clone_s"), (f"checkout of {TAGS} tags", "checkout_s")]
    groups = [f"{c // b.MIB} MiB" for c in caches] + [FAST, ORIGIN]
    values = {}
    for r in rows:
        group = f"{r['cache_mib']} MiB" if r.get("cache_mib") else r["target"]
        bar = r["target"] if r.get("cache_mib") else "device alone"
        for phase, key in phases:
            values[(phase, group, bar)] = r[key]
    plots.grouped_bars(out / "times.png",
                       f"git on ext4 over nbdfuse + loop, {vol // b.MIB} MiB hdd: volume: clone of a generated "
                       f"repository ({files} files, {commits} commits, pack {pack_bytes / b.MIB:.0f} MiB), then "
                       f"checkout of {TAGS} tags; cache: writeback, {BLOCK // b.KIB} KiB blocks; writecache: "
                       f"{WRITECACHE_BLOCK // b.KIB} KiB blocks (scale {ctx.scale:g}); lower is better",
                       groups, chosen + ["device alone"], values, "time (s, including the syncs)",
                       "fast device size, or the device alone",
                       panels=[ph for ph, _ in phases], colors=[COLORS[t] for t in chosen] + ["#7f7f7f"])
    origin_row = rows[0]
    return {
        "setup": {"files": files, "commits": commits, "files_per_commit": per_commit(files), "tags": TAGS,
                  "pack_bytes": pack_bytes, "volume_bytes": vol, "cache_sizes_bytes": caches,
                  "cache": {"mode": "writeback", "block_bytes": BLOCK},
                  "writecache": {"block_bytes": WRITECACHE_BLOCK, "tunables": "default"}},
        "working_set": {"repo_disk_bytes": origin_row["repo_disk_bytes"],
                        "checkout_write_bytes": origin_row["checkout_write_bytes"],
                        "clone_write_bytes": origin_row["clone_write_bytes"]},
        "table_s": {r["config"]: {"clone": r["clone_s"], "checkout": r["checkout_s"]} for r in rows},
        "rows": rows,
        "files": ["times.csv", "times.png"],
    }
