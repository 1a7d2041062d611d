#!/usr/bin/env bash
# `pnpm test:k8s`: builds (or finds cached) helm, the rig's binaries, the llm-d parts (the stock
# endpoint picker, Envoy) and Prometheus (with Kubernetes discovery) while the network is there,
# then runs the k8s test project in a network namespace of its own (unshare -rn: a user namespace
# maps root, so no privileges are needed where user namespaces are enabled) with only lo up.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/tools/helm.sh >/dev/null
bash scripts/k8s-rig/build.sh >/dev/null
bash scripts/k8s-rig/build-llmd.sh >/dev/null
bash scripts/k8s-rig/build-prometheus.sh >/dev/null
exec unshare -rn -- sh -c 'ip link set lo up && exec node_modules/.bin/vitest run --config test/k8s/vitest.config.ts "$@"' sh "$@"
