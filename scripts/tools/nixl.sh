#!/usr/bin/env bash
# Prints the path of a Python with NIXL 1.5.1 (the nixl and nixl-cu12 wheels from PyPI, matching
# versions; the wheel bundles its UCX, no CUDA needed), installing them into a venv in the airm
# cache on first use (seconds; ~340 MB) and reusing it after. The nixl KV transport's sidecar
# runs its agent with it (AIRM_NIXL_PYTHON overrides).
set -euo pipefail
version=1.5.1
venv="$HOME/.cache/airm/nixl-$version/venv"
if ! "$venv/bin/python" -c "import nixl._api" >/dev/null 2>&1; then
  command -v python3 >/dev/null || { echo "nixl.sh: needs python3 (with venv) to install the NIXL wheels" >&2; exit 1; }
  echo "nixl.sh: installing nixl $version into $venv (once)" >&2
  tmp="$venv.build-$$"
  rm -rf "$tmp"
  python3 -m venv "$tmp" >&2
  "$tmp/bin/pip" install -q --disable-pip-version-check --no-deps "nixl==$version" "nixl-cu12==$version" numpy >&2
  "$tmp/bin/python" -c "import nixl._api" >&2
  rm -rf "$venv"
  mv "$tmp" "$venv"
  # a venv's scripts name the folder they were made in: make them again at the final place
  python3 -m venv --upgrade "$venv" >/dev/null 2>&1 || true
fi
echo "$venv/bin/python"
