#!/usr/bin/env bash
# Prints the path of helm v3.22.0, building it with `go install` into the airm tool cache on first
# use (~3.5 min on 2 cores; the Go module proxy is the only source needed) and reusing it after.
set -euo pipefail
version=v3.22.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/helm-$version"
if [ ! -x "$cache/helm" ]; then
  command -v go >/dev/null || { echo "helm.sh: building helm $version needs Go (go install); install Go or put helm $version at $cache/helm" >&2; exit 1; }
  echo "helm.sh: building helm $version into $cache (once)" >&2
  tmp="$cache.build-$$"
  mkdir -p "$tmp"
  GOBIN="$tmp" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$version" >&2
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache"
  mv "$tmp" "$cache"
fi
echo "$cache/helm"
