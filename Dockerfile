# The rngd-pd image the chart's `image.mode: built` runs: the repository installed under /app
# (the chart's commands are `node /app/packages/<part>/bin/<bin>.mjs`). NPU SDKs (FuriosaAI,
# Rebellions runtime libraries) are not included: add them in an image built FROM this one, or use
# `image.mode: hostPath`. The NIXL wheels (the nixl transport's agent) go in a venv under /opt/airm
# (the chart's nixl.python). Not built in this project's CI (it has no container runtime).
FROM node:24.22.3-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libucx0 ca-certificates python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN npm install -g --no-fund --no-audit "pnpm@$(node -p 'require("./package.json").packageManager.split("@")[1]')" \
 && pnpm install --frozen-lockfile \
 && HOME=/opt/airm bash scripts/tools/nixl.sh \
 && chown -R 65532:65532 /app
USER 65532
ENV AIRM_ARTIFACT_CACHE=/cache/artifacts
EXPOSE 8000 8101 8102 7400 9400
CMD ["node", "/app/packages/gateway/bin/airm-gateway.mjs", "--help"]
