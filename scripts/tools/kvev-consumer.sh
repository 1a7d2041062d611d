#!/usr/bin/env bash
# Builds the KV-event consumer the wire-format test runs (scripts/tools/kvev-consumer: llm-d's own
# vLLM event decoder, github.com/llm-d/llm-d-kv-cache v0.9.0, over ZMQ) from the Go module proxy,
# once per version, into the airm tool cache, and prints that folder. ~3 min cold on 2 cores (its
# Kubernetes dependencies are those the endpoint picker's build already compiled: less after it).
# Warm: immediate. Needs Go.
set -euo pipefail
LLMD=v0.9.0
here="$(cd "$(dirname "$0")" && pwd)/kvev-consumer"
sum=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
out="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/llmd-kvev-consumer-$LLMD-$sum"
if [ -x "$out/bin/kvev-consumer" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "kvev-consumer: needs Go" >&2; exit 1; }
work="$out.build-$$"
rm -rf "$work"
mkdir -p "$work/bin"
echo "kvev-consumer: building llm-d-kv-cache $LLMD's decoder" >&2
(cd "$here" && GOFLAGS=-mod=readonly go build -o "$work/bin/kvev-consumer" .) >&2
rm -rf "$out"
mv "$work" "$out"
echo "$out"
