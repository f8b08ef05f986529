"""git (seed 003's git extract test): ext4 on the cached volume through nbdfuse + a loop
device, made without discard; a large git repository is cloned onto it (a write load as
far as the cache is concerned), the file system is remounted cold, and 20 tags are checked
out one after another (reads of what was written, and writes). Each phase is timed with
its final sync, for a sweep of cache sizes (strata, writeback) and for the hdd: origin
alone.

The repository is generated deterministically here (git fast-import from a seeded PRNG):
thousands of files in nested folders, hundreds of commits that each rewrite part of a few
dozen files and add or remove some, and 20 tags spread over the history.

Scale 1: 3000 files, 300 commits, 20 tags; a 2 GiB volume; caches 16, 64 and 256 MiB.
Needs root, /dev/fuse, a free loop device, nbdfuse, mkfs.ext4 and git; skipped otherwise.
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
TAGS = 20
TOOLS = ["nbdfuse", "losetup", "mkfs.ext4", "mount", "umount", "fusermount3", "git", "sync"]
ORIGIN = "origin alone"


def params(scale):
    files = max(200, int(3000 * scale))
    commits = max(TAGS, int(300 * scale))
    vol = max(128, int(2048 * scale)) * b.MIB
    caches = [max(4, int(c * scale)) for c in (16, 64, 256)] if scale >= 0.25 else [8]
    return files, commits, vol, [c * b.MIB for c in caches]


def expected_seconds(scale):
    files, commits, vol, caches = params(scale)
    per_run = 4 + files / 300 + commits / 10 + vol / (60 * b.MIB)
    return (len(caches) + 1) * per_run + files / 200 + commits / 20


def unavailable():
    if os.geteuid() != 0:
        return "needs root (losetup, mount)"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if not Path("/dev/loop-control").exists():
        return "/dev/loop-control is missing (no loop devices)"
    missing = [t for t in TOOLS if b.which(t) is None]
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
    content = {p: _text(rng, rng.randint(20, 200)) for p in paths}
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
            touched = rng.sample(sorted(content), k=min(len(content), max(3, files // 60)))
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
                content[p] = _text(rng, rng.randint(20, 200))
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


def one_run(ctx, label, spec, src, tags, work):
    """mkfs, clone (timed), cold remount, checkout of every tag (timed) on `spec`."""
    p = ctx.progress
    sock = work / "s.sock"
    r = {"config": label}
    with b.Strata(ctx, sock, f"vol={spec}") as s:
        fl = FuseLoop(ctx, s.uri("vol"), work)
        try:
            fl.attach()
            p.set(step=f"{label}: mkfs.ext4")
            b.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", fl.dev],
                  timeout=1800)
            fl.mount()
            c0 = io_counts(s)
            p.set(step=f"{label}: git clone")
            t0 = time.time()
            b.run(["git", "clone", "-q", "--no-hardlinks", src, fl.mnt / "repo"], timeout=3600)
            b.run(["sync", "-f", fl.mnt / "repo"], timeout=3600)
            r["clone_s"] = time.time() - t0
            c1 = io_counts(s)
            # Cold caches for the checkout phase: unmount, fresh loop device, mount again.
            fl.umount()
            fl.detach()
            fl.attach()
            fl.mount()
            c2 = io_counts(s)
            t0 = time.time()
            for i, tag in enumerate(tags):
                p.set(step=f"{label}: git checkout {tag} ({i + 1}/{len(tags)})")
                b.run(["git", "-C", fl.mnt / "repo", "checkout", "-q", tag], timeout=3600)
            b.run(["sync", "-f", fl.mnt / "repo"], timeout=3600)
            r["checkout_s"] = time.time() - t0
            c3 = io_counts(s)
            r |= {f"clone_{k}": c1[k] - c0[k] for k in c0} | {f"checkout_{k}": c3[k] - c2[k] for k in c2}
            t = s.target("vol") if spec.startswith("cache:") else {}
            if t:
                r |= {"hit_ratio_total": t.get("hit_ratio_total"), "promotions": t.get("promotions"),
                      "dirty_blocks_end": t.get("dirty_blocks"), "bypassed": t.get("bypassed")}
        finally:
            fl.close()
    return r


def run(ctx):
    why = unavailable()
    if why:
        ctx.progress.note(f"  {NAME}: SKIPPED: {why}")
        return {"skipped": why}
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
    rows = []
    p.set(step="writing the origin")
    b.fill_random(origin, vol)
    rows.append(one_run(ctx, ORIGIN, f"hdd:{origin}", src, tags, work))
    p.note(f"  {NAME}: {ORIGIN}: clone {rows[-1]['clone_s']:.1f} s, checkout {rows[-1]['checkout_s']:.1f} s")
    for c in caches:
        if cachef.exists():
            cachef.unlink()
        b.cache_create(ctx, f"hdd:{origin}", f"{cachef}?size={b.size_str(b.cache_file_bytes(c, BLOCK))}")
        label = f"strata {c // b.MIB} MiB"
        rows.append(one_run(ctx, label, f"cache:{cachef}", src, tags, work) | {"cache_mib": c // b.MIB})
        p.note(f"  {NAME}: {label}: clone {rows[-1]['clone_s']:.1f} s, checkout {rows[-1]['checkout_s']:.1f} s")

    b.write_csv(out / "times.csv", rows, ["config", "cache_mib", "clone_s", "checkout_s", "hit_ratio_total",
                                          "promotions", "bypassed", "dirty_blocks_end", "clone_write_bytes",
                                          "clone_read_bytes", "checkout_read_bytes", "checkout_write_bytes",
                                          "checkout_read_requests", "checkout_write_requests"])
    groups = [r["config"] for r in rows]
    values = {}
    for r in rows:
        values[(None, r["config"], "clone")] = r["clone_s"]
        values[(None, r["config"], f"checkout of {TAGS} tags")] = r["checkout_s"]
    plots.grouped_bars(out / "times.png",
                       f"git on ext4 over nbdfuse + loop: clone of a generated repository ({files} files, {commits} "
                       f"commits, pack {pack_bytes / b.MIB:.0f} MiB), then checkout of {TAGS} tags; {vol // b.MIB} "
                       f"MiB hdd: volume, strata writeback cache, 64 KiB blocks (scale {ctx.scale:g}); lower is better",
                       groups, ["clone", f"checkout of {TAGS} tags"], values, "time (s, including the final sync)",
                       "configuration")
    return {
        "setup": {"files": files, "commits": commits, "tags": TAGS, "pack_bytes": pack_bytes, "volume_bytes": vol,
                  "cache_sizes_bytes": caches, "mode": "writeback", "block_bytes": BLOCK},
        "rows": rows,
        "files": ["times.csv", "times.png"],
    }
