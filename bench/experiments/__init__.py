"""The experiments of the benchmark suite, in the order `run.py all` runs them. Each module
has NAME, TITLE, expected_seconds(scale) and run(ctx) -> summary dict, and writes its CSV
and PNG files into ctx.dir(NAME)."""

ORDER = ["warmup", "small_cache", "mixed", "writeback", "writelog", "git", "metadata", "overhead", "connections", "qos",
         "remote", "thin", "policies"]
# Names as typed on the command line (small-cache) and as module names (small_cache).
ALIASES = {"small-cache": "small_cache"}
