#!/usr/bin/env bash
# Builds a Prometheus server (v3.16.0) with Kubernetes service discovery from the Go module proxy,
# once per version, into the airm tool cache, and prints the binary's path as the last stdout line.
# Debian's prometheus (2.42) has no kubernetes_sd_configs. Only the file, http and kubernetes
# discoveries are built in (remove_all_sd,enable_kubernetes_sd) and the web UI is left out (no
# builtinassets: the API and /-/ready work, the UI pages fail). Cold: ~7.5 min on 2 busy cores
# (~450 s CPU, ~1 GB more Go build cache); warm: immediate. Needs Go >= 1.26.7 (the module's go
# directive). promtool is not built: Debian's checks rules, but not a config with kubernetes_sd_configs.
set -euo pipefail
PROM=3.16.0
# Prometheus 3.x is published on the module proxy as github.com/prometheus/prometheus v0.3MM.P.
minor=${PROM#3.}; minor=${minor%%.*}; patch=${PROM##*.}
MOD="v0.3$(printf %02d "$minor").$patch"
TAGS=remove_all_sd,enable_kubernetes_sd
out="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/prometheus-$PROM"
if [ -x "$out/bin/prometheus" ]; then
  echo "$out/bin/prometheus"
  exit 0
fi
command -v go >/dev/null || { echo "prometheus: needs Go to build the server" >&2; exit 1; }
log() { echo "prometheus: $*" >&2; }
work="$out.build-$$"
rm -rf "$work"
mkdir -p "$work/bin"
trap 'rm -rf "$work"' EXIT

log "prometheus $PROM (module $MOD, tags $TAGS)"
v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=$PROM -X $v.Revision=$MOD -X $v.Branch=HEAD -X $v.BuildUser=airm@k8s-rig -X $v.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
# The module has no replace directives, so `go install pkg@version` works outside any module.
# CGO off: a static binary with Go's own DNS resolver (upstream builds with the netgo tag too).
cd /
GOBIN="$work/bin" GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0 \
  go install -tags "$TAGS" -ldflags "$ldflags" "github.com/prometheus/prometheus/cmd/prometheus@$MOD" >&2
"$work/bin/prometheus" --version >&2

rm -rf "$out"
mv "$work" "$out"
trap - EXIT
log "built into $out"
echo "$out/bin/prometheus"
