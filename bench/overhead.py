#!/usr/bin/env python3
"""The NBD data path against its peers; now the `overhead` experiment of the suite:

    bench/run.py overhead [--scale S] [--out DIR]

This script stays as a shortcut for it (same arguments as run.py after the name).
"""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    run = Path(__file__).resolve().parent / "run.py"
    os.execv(sys.executable, [sys.executable, str(run), "overhead", *sys.argv[1:]])
