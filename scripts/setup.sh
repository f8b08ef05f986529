#!/usr/bin/env bash
# Installs what strata's demo, tests and benchmarks use (Debian packages), then builds.
# Safe to run again; uses sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(fio qemu-utils nbdkit libnbd-bin gnutls-bin openssl libssl-dev pkg-config fuse3 e2fsprogs util-linux fonts-dejavu-core thin-provisioning-tools)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# promtool (from Debian's prometheus package) checks /metrics in the tests. Only the tool is
# wanted: where the package's server was started by the install, stop and disable it.
if ! command -v promtool >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing prometheus (for promtool)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "setup: installing matplotlib (for the benchmark plots)"
  python3 -m pip install --quiet matplotlib
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    echo "setup: installing the $c component (the test command checks formatting and lints)"
    rustup component add "$c"
  fi
done
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install --locked cargo-nextest
fi
cargo build --release --bin strata
