#!/usr/bin/env bash
# Builds the Kubernetes test rig's binaries from the Go module proxy, once per version, into the
# airm tool cache, and prints that folder: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl (v1.36.3), etcd (v3.6.16), kwok (v0.8.0), and kwok's stage files. Cold: ~11 min on
# 2 cores (Go build cache ~6 GB); warm: immediate. Needs Go.
set -euo pipefail
K8S=v1.36.3 STAGING=v0.36.3 ETCD=v3.6.16 KWOK=v0.8.0
out="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/k8s-rig-$K8S-etcd-$ETCD-kwok-$KWOK"
if [ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/etcd" ] && [ -x "$out/bin/kwok" ] && [ -d "$out/stages" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "k8s-rig: needs Go to build the control plane" >&2; exit 1; }
work="$out.build-$$"
rm -rf "$work"
mkdir -p "$work/bin" "$work/k8s" "$work/etcd"
log() { echo "k8s-rig: $*" >&2; }

log "kwok $KWOK"
GOBIN="$work/bin" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK" >&2
kwokdir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
mkdir -p "$work/stages"
for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  cp "$kwokdir/kustomize/stage/$f" "$work/stages/$(basename "$f")"
done

log "kubernetes $K8S (apiserver, controller-manager, scheduler, kubectl)"
k8sdir=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
cd "$work/k8s"
{
  echo "module airm.local/k8s-rig"
  echo "go 1.25"
  echo "require k8s.io/kubernetes $K8S"
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#replace \1 => \1 '"$STAGING"'#p' "$k8sdir/go.mod"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
GOFLAGS=-mod=mod go mod tidy -e >&2 || true
minor=${K8S#v1.}; minor=${minor%%.*}
ldflags="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
GOFLAGS=-mod=mod go build -tags tools -ldflags "$ldflags" -o "$work/bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2

log "etcd $ETCD"
cd "$work/etcd"
cat > go.mod <<MOD
module airm.local/etcd-rig
go 1.25
require (
	go.etcd.io/etcd/server/v3 $ETCD
	go.etcd.io/etcd/api/v3 $ETCD
	go.etcd.io/etcd/client/pkg/v3 $ETCD
	go.etcd.io/etcd/client/v3 $ETCD
	go.etcd.io/etcd/pkg/v3 $ETCD
)
MOD
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
GOFLAGS=-mod=mod go mod tidy -e >&2 || true
GOFLAGS=-mod=mod go build -o "$work/bin/etcd" go.etcd.io/etcd/server/v3 >&2

cd /
rm -rf "$work/k8s" "$work/etcd"
rm -rf "$out"
mv "$work" "$out"
log "built into $out"
echo "$out"
