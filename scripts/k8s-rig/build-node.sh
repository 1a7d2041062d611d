#!/usr/bin/env bash
# Builds a real Kubernetes node for the test rig from the Go module proxy, once per version, into
# the airm tool cache, and prints that folder (last stdout line; logs go to stderr):
#   bin/kubelet                  k8s.io/kubernetes/cmd/kubelet v1.36.3
#   bin/containerd, bin/ctr,     github.com/containerd/containerd/v2 v2.4.2, static (CGO off):
#   bin/containerd-shim-runc-v2  (kubelet 1.37 drops containerd 1.x, so not Debian's 1.6)
#   cni/{bridge,host-local,loopback,portmap}  containernetworking/plugins (only when the host has
#                                no /usr/lib/cni/bridge; otherwise use the host's, see notes)
#   pause.tar                    docker archive of localhost/pause:airm: a static Go binary FROM
#                                scratch that sleeps until SIGTERM/SIGINT (reaps children);
#                                load with `ctr -n k8s.io images import pause.tar`
# Cold on 2 busy cores (empty Go build cache): containerd + ctr + shim ~6 min, pause ~20 s,
# kubelet ~15 min (~3 min once build.sh has filled the Go build cache); +2.5 GB of build cache.
# Warm: immediate. Needs Go >= 1.26.6 (containerd v2.4's go.mod) and runc on the host (Debian's
# runc 1.1.5 works). How to run the node: /tmp/kubelet-node-notes.md (to be folded into the rig).
set -euo pipefail
K8S=v1.36.3 STAGING=v0.36.3 CONTAINERD=v2.4.2 CNI=v1.10.0 PAUSE=airm1
out="${XDG_CACHE_HOME:-$HOME/.cache}/airm/tools/k8s-node-$K8S-containerd-$CONTAINERD-pause-$PAUSE"
if [ -x "$out/bin/kubelet" ] && [ -x "$out/bin/containerd" ] && [ -x "$out/bin/containerd-shim-runc-v2" ] && [ -x "$out/bin/ctr" ] && [ -f "$out/pause.tar" ]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "k8s-node: needs Go to build the node" >&2; exit 1; }
work="$out.build-$$"
rm -rf "$work"
mkdir -p "$work/bin" "$work/k8s" "$work/pause/root"
trap 'rm -rf "$work"' EXIT
log() { echo "k8s-node: $*" >&2; }
elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

t=$(date +%s)
log "containerd $CONTAINERD (containerd, ctr, containerd-shim-runc-v2)"
tags="urfave_cli_no_docs no_btrfs osusergo netgo static_build"
ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD -X github.com/containerd/containerd/v2/version.Revision=airm"
CGO_ENABLED=0 GOBIN="$work/bin" go install -tags "$tags" -ldflags "$ld" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD" "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD" >&2
CGO_ENABLED=0 GOBIN="$work/bin" go install -tags "$tags no_grpc" -ldflags "$ld" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD" >&2
log "containerd built in $(elapsed "$t")"

if [ ! -x /usr/lib/cni/bridge ]; then
  t=$(date +%s)
  log "CNI plugins $CNI (the host has none in /usr/lib/cni)"
  mkdir -p "$work/cni"
  CGO_ENABLED=0 GOBIN="$work/cni" go install -ldflags "-s -w" \
    "github.com/containernetworking/plugins/plugins/main/bridge@$CNI" "github.com/containernetworking/plugins/plugins/main/loopback@$CNI" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI" "github.com/containernetworking/plugins/plugins/meta/portmap@$CNI" >&2
  log "CNI plugins built in $(elapsed "$t")"
fi

t=$(date +%s)
log "pause image localhost/pause:airm"
cd "$work/pause"
printf 'module airm.local/pause\ngo 1.25\n' > go.mod
cat > main.go <<'GO'
// pause: the pod sandbox's process. Sleeps until SIGTERM or SIGINT, reaping any children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 8)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
GO
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o root/pause . >&2
# A docker archive by hand (no registry, no buildah): one layer holding /pause, its config, and
# manifest.json naming the tag. ctr import keeps "localhost/pause:airm" as is.
mkdir -p img/layer
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C root -cf img/layer/layer.tar pause
diff=$(sha256sum img/layer/layer.tar | cut -d' ' -f1)
printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Entrypoint":["/pause"],"User":"65535:65535","WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"airm build-node.sh"}]}' "$diff" > config.json
cfg=$(sha256sum config.json | cut -d' ' -f1)
mv config.json "img/$cfg.json"
printf '[{"Config":"%s.json","RepoTags":["localhost/pause:airm"],"Layers":["layer/layer.tar"]}]' "$cfg" > img/manifest.json
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C img -cf "$work/pause.tar" manifest.json "$cfg.json" layer/layer.tar
log "pause image built in $(elapsed "$t")"

t=$(date +%s)
log "kubelet $K8S"
k8sdir=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
cd "$work/k8s"
{
  echo "module airm.local/k8s-node"
  echo "go 1.25"
  echo "require k8s.io/kubernetes $K8S"
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#replace \1 => \1 '"$STAGING"'#p' "$k8sdir/go.mod"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
GO
GOFLAGS=-mod=mod go mod tidy -e >&2 || true
minor=${K8S#v1.}; minor=${minor%%.*}
ldflags="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
GOFLAGS=-mod=mod go build -tags tools -ldflags "$ldflags" -o "$work/bin/" k8s.io/kubernetes/cmd/kubelet >&2
log "kubelet built in $(elapsed "$t")"

cd /
rm -rf "$work/k8s" "$work/pause"
rm -rf "$out"
mv "$work" "$out"
trap - EXIT
log "built into $out"
echo "$out"
