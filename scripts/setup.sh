#!/usr/bin/env bash
# Installs what rngd-pd needs on a fresh Debian/Ubuntu machine with Node 20: system libraries
# (UCX for the nixl-ucx transport, iperf3 and ucx-utils for the transport benches, openssl and
# iproute2 for the Kubernetes test rig), pnpm at the
# version package.json pins, the workspace's dependencies and the NIXL wheels (python3-venv).
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in libucx0 ucx-utils iperf3 openssl iproute2 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need ${need_apt[*]} (apt) but am not root and have no sudo; install them and rerun" >&2; exit 1
  fi
  echo "setup: installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

want_pnpm=$(node -p 'require("./package.json").packageManager.split("@")[1]')
if [ "$(pnpm --version 2>/dev/null || true)" != "$want_pnpm" ]; then
  echo "setup: installing pnpm $want_pnpm"
  npm install -g --no-fund --no-audit "pnpm@$want_pnpm" >/dev/null 2>&1
fi

pnpm install --frozen-lockfile --reporter=append-only 2>&1 | tail -n 3

# NIXL 1.5.1 (PyPI wheels, bundled UCX) for the nixl KV transport's sidecar, in a venv in the airm
# cache (seconds when PyPI answers; without it the nixl tests say skipped with the reason).
bash scripts/tools/nixl.sh >/dev/null || echo "setup: the NIXL wheels could not be installed; the nixl transport's tests will be skipped" >&2
