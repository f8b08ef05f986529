#!/usr/bin/env python3
"""Writes the seed corpus of the nbd_session fuzz target: a few valid client sessions that
together reach every option and command, so the fuzzer starts past the handshake. The bytes
follow crates/strata-nbd/src/proto.rs; run from anywhere, rewrites corpus/nbd_session/seed-*.

Usage: fuzz/gen_corpus.py
"""
import os
import struct

IHAVEOPT = 0x49484156454F5054
REQUEST_MAGIC = 0x25609513
FIXED_NEWSTYLE, NO_ZEROES = 1, 2
(OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY,
 OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT) = 1, 2, 3, 5, 6, 7, 8, 9, 10
INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 1, 2, 3
READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES, BLOCK_STATUS = 0, 1, 2, 3, 4, 5, 6, 7
FUA, NO_HOLE, DF, REQ_ONE, FAST_ZERO = 1, 2, 4, 8, 16


def flags(f=FIXED_NEWSTYLE | NO_ZEROES):
    return struct.pack(">I", f)


def opt(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def name_reqs(name, reqs=()):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(reqs)) + b"".join(struct.pack(">H", r) for r in reqs)


def meta(name, queries):
    out = struct.pack(">I", len(name)) + name + struct.pack(">I", len(queries))
    return out + b"".join(struct.pack(">I", len(q)) + q for q in queries)


def req(kind, offset=0, length=0, fl=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, fl, kind, cookie, offset, length) + payload


SESSIONS = {
    "simple-rw": flags() + opt(OPT_GO, name_reqs(b"mem")) + req(WRITE, 4096, 8, cookie=1, payload=b"abcdefgh")
    + req(READ, 4096, 8, cookie=2) + req(FLUSH, cookie=3) + req(DISC, cookie=4),
    "structured-all": flags() + opt(OPT_STRUCTURED_REPLY) + opt(OPT_SET_META_CONTEXT, meta(b"mem", [b"base:allocation"]))
    + opt(OPT_GO, name_reqs(b"mem", [INFO_BLOCK_SIZE])) + req(WRITE, 0, 512, FUA, 1, bytes(range(256)) * 2)
    + req(READ, 0, 512, DF, 2) + req(BLOCK_STATUS, 0, 1 << 20, 0, 3) + req(BLOCK_STATUS, 0, 4096, REQ_ONE, 4)
    + req(TRIM, 0, 4096, FUA, 5) + req(WRITE_ZEROES, 4096, 4096, NO_HOLE | FAST_ZERO, 6) + req(CACHE, 0, 4096, 0, 7)
    + req(READ, 1 << 20, 512, 0, 8) + req(DISC, cookie=9),
    "export-name": flags(FIXED_NEWSTYLE) + opt(OPT_EXPORT_NAME, b"") + req(READ, 0, 16, cookie=1)
    + req(WRITE, 8, 4, cookie=2, payload=b"wxyz") + req(DISC, cookie=3),
    "options-then-ro": flags() + opt(OPT_LIST) + opt(OPT_INFO, name_reqs(b"mem", [INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]))
    + opt(OPT_STRUCTURED_REPLY) + opt(OPT_LIST_META_CONTEXT, meta(b"ro", [])) + opt(OPT_STARTTLS) + opt(99, b"junk")
    + opt(OPT_GO, name_reqs(b"nope")) + opt(OPT_GO, name_reqs(b"ro")) + req(WRITE, 0, 4, cookie=1, payload=b"nope")
    + req(READ, 0, 4, cookie=2),
    "errors": flags() + opt(OPT_GO, name_reqs(b"mem", [INFO_BLOCK_SIZE])) + req(READ, 1, 511, cookie=1)
    + req(42, cookie=2) + req(READ, 0, 0, cookie=3) + req(READ, 0, 1 << 20, cookie=4)
    + req(WRITE, (1 << 20) - 2, 4, cookie=5, payload=b"over") + req(WRITE, 0, 300 << 10, cookie=6) ,
    "abort": flags() + opt(OPT_ABORT),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "nbd_session")
os.makedirs(here, exist_ok=True)
for name, data in SESSIONS.items():
    with open(os.path.join(here, "seed-" + name), "wb") as f:
        f.write(data)
print(f"wrote {len(SESSIONS)} seed sessions to {here}")
