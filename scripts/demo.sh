#!/usr/bin/env bash
# The README's first command: set up, then run the demo (a served volume driven by fio).
# Its scratch files go to /var/tmp/strata-demo (`--dir DIR` elsewhere), never the work tree.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec target/release/strata demo "$@"
