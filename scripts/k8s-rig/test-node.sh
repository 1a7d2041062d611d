#!/usr/bin/env bash
# `pnpm test:k8s-node`: the chart on a REAL kubelet node (scripts/k8s-rig/NODE.md). Builds (or
# finds cached) helm, the rig's binaries, the node's binaries (build-node.sh) and the project image
# (scripts/image/build.sh) while the network is there, then runs the k8s-node test project inside
# private network and mount namespaces (unshare -n -m: needs real root; a user namespace cannot
# mount overlayfs for runc or write cgroups) set up as the node's host: lo, rshared /, private
# /var/log, /var/lib/cni, /var/lib/kubelet and /run/containerd, the six sysctls the kubelet writes
# bound over /proc/sys in this mount namespace only, a cgroup prefix and a temporary folder
# (TMPDIR) of its own. Afterwards it kills whatever is left in the namespace and in its cgroups,
# and removes them and its folders. A signal (SIGTERM, SIGINT, SIGHUP) stops the tests and their
# rigs (run-tests.sh), then does the same.
# Usage: scripts/k8s-rig/test-node.sh [vitest args]. Env: RIG_NODE_IMAGE=localhost/rngd-pd:<tag>
# uses that image instead of building one.
set -euo pipefail
cd "$(dirname "$0")/../.."

source scripts/k8s-rig/run-tests.sh
if [[ ${1:-} != --in-ns ]]; then
  if [[ $(id -u) != 0 ]] || ! unshare -n -m true 2>/dev/null; then
    echo "test-node.sh: SKIPPED: a real kubelet node needs real root (unshare -n -m); not available here" >&2
    exit 0
  fi
  stop_with_pnpm
  t0=$SECONDS
  bash scripts/tools/helm.sh >/dev/null
  bash scripts/k8s-rig/build.sh >/dev/null
  bash scripts/k8s-rig/build-node.sh >/dev/null
  export RIG_NODE_IMAGE=${RIG_NODE_IMAGE:-$(CONTAINERS_CONF=$PWD/scripts/image/containers.conf bash scripts/image/build.sh | tail -n 1)}
  echo "test-node.sh: binaries and image $RIG_NODE_IMAGE ready in $((SECONDS - t0)) s" >&2
  # Mountpoints on the host, left empty on purpose: removing one while a parallel run's namespace
  # has a mount there would detach that mount (NODE.md, traps).
  mkdir -p /run/containerd /var/lib/kubelet /var/lib/cni
  exec unshare -n -m --propagation private -- bash scripts/k8s-rig/test-node.sh --in-ns "$@"
fi
shift

# --- inside the private network and mount namespaces
ip link set lo up
mount --make-rshared /
priv=$(mktemp -d /tmp/airm-node-priv-XXXXXX)
mkdir -p "$priv/varlog" "$priv/varlibcni" "$priv/varlibkubelet" "$priv/sysctl"
# Host paths the node writes no matter its configuration: /var/log/containers (kubelet's symlinks),
# /var/lib/cni (libcni's cache), /var/lib/kubelet/device-plugins (the device manager's socket and
# checkpoint; the chart also mounts that folder into the workers), /run/containerd/s (shim sockets).
mount --bind "$priv/varlog" /var/log
mount --bind "$priv/varlibcni" /var/lib/cni
mount --bind "$priv/varlibkubelet" /var/lib/kubelet
mount -t tmpfs -o mode=0711 tmpfs /run/containerd
# The kubelet sets six global sysctls: files with the values it wants, bound over /proc/sys here
# only (the host keeps its own).
sysctls=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)
for kv in "${sysctls[@]}"; do
  f=${kv%%=*}
  echo "${kv#*=}" >"$priv/sysctl/${f//\//_}"
  mount --bind "$priv/sysctl/${f//\//_}" "/proc/sys/$f"
done
# node.ts keeps each node's folder under $RIG_NODE_TMP and its cgroups under $RIG_NODE_CGROUP_PREFIX-<node>.
mkdir -p "$priv/nodes" "$priv/tmp"
export RIG_NODE_NS=1 RIG_NODE_CGROUP_PREFIX=airm-node-$$ RIG_NODE_TMP=$priv/nodes TMPDIR=$priv/tmp

# Safety net when the test died without stopping its node: whatever still runs in this network
# namespace (control plane, kubelet, containerd, shims) or in the node's cgroups (containers run
# in pod network namespaces of their own), then the cgroups, the mounts and the folders.
sweep() {
  kill_netns_leftovers test-node.sh
  local d c m pid
  for d in /sys/fs/cgroup/pids/"$RIG_NODE_CGROUP_PREFIX"-*; do
    [[ -d $d ]] || continue
    for pid in $(find "$d" -name cgroup.procs -exec cat {} +); do kill -9 "$pid" 2>/dev/null && echo "test-node.sh: killed leftover container process $pid" >&2; done
  done
  sleep 0.5
  for c in /sys/fs/cgroup/*/"$RIG_NODE_CGROUP_PREFIX"-*; do
    [[ -d $c ]] || continue
    echo "test-node.sh: the test left cgroup $c" >&2
    find "$c" -depth -type d -exec rmdir {} + || echo "test-node.sh: could not remove $c" >&2
    [[ $rc == 0 ]] && rc=1
  done
  findmnt -rn -o TARGET | { grep "^$priv/nodes/" || true; } | sort -r | xargs -r -n1 umount -l
  # The mounts above go with this namespace; the folder does not.
  for m in /proc/sys/vm/overcommit_memory /proc/sys/vm/panic_on_oom /proc/sys/kernel/panic /proc/sys/kernel/panic_on_oops /proc/sys/kernel/keys/root_maxkeys /proc/sys/kernel/keys/root_maxbytes /run/containerd /var/lib/kubelet /var/lib/cni /var/log; do
    umount "$m" || true
  done
  rm -rf "$priv"
}
run_tests node_modules/.bin/vitest run --config test/k8s-node/vitest.config.ts "$@"
sweep
exit "$rc"
