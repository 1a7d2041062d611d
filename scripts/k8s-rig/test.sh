#!/usr/bin/env bash
# `pnpm test:k8s`: builds (or finds cached) helm, the rig's binaries, the llm-d parts (the stock
# endpoint picker, Envoy) and Prometheus (with Kubernetes discovery) while the network is there,
# then runs the k8s test project in a network namespace of its own (unshare -rn: a user namespace
# maps root, so no privileges are needed where user namespaces are enabled) with only lo up, and a
# temporary folder of the run's own (TMPDIR). A signal (SIGTERM, SIGINT, SIGHUP) stops the tests
# and their rigs (run-tests.sh); after the tests, stopped or not, whatever still runs in the
# namespace is killed and the run's folder removed.
set -euo pipefail
cd "$(dirname "$0")/../.."

source scripts/k8s-rig/run-tests.sh
if [[ ${1:-} != --in-ns ]]; then
  stop_with_pnpm
  bash scripts/tools/helm.sh >/dev/null
  bash scripts/k8s-rig/build.sh >/dev/null
  bash scripts/k8s-rig/build-llmd.sh >/dev/null
  bash scripts/k8s-rig/build-prometheus.sh >/dev/null
  exec unshare -rn -- bash scripts/k8s-rig/test.sh --in-ns "$@"
fi
shift

# --- inside the network namespace
ip link set lo up
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/airm-k8s-run-XXXXXX")
export TMPDIR
sweep() {
  kill_netns_leftovers test.sh
  rm -rf "$TMPDIR"
}
run_tests node_modules/.bin/vitest run --config test/k8s/vitest.config.ts "$@"
sweep
exit "$rc"
