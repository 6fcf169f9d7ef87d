#!/usr/bin/env bash
# Regenerate the OpenAPI document and the Python client from the app, deterministically:
#   1. export openapi.json from create_app(Settings()) (python -m scripts.export_openapi; no model load)
#   2. generate clients/python/ (package softknn_client, project softknn-client) with a pinned
#      openapi-python-client, formatted by its post-hooks with a pinned ruff
#   3. replace clients/python/ with the result
#
#   bash scripts/gen_client.sh            regenerate openapi.json and clients/python/
#   bash scripts/gen_client.sh --check    change nothing; exit 1 when openapi.json differs from the app
#                                         or clients/python/ differs from what openapi.json generates
#
# The generator runs from its own venv (it pins typer/pydantic versions of its own): created on first
# use from PyPI, then reused offline. Env: OPENAPI_CLIENT_VENV (default
# ${XDG_CACHE_HOME:-~/.cache}/softknn/openapi-client-venv), PYTHON (the project's interpreter, default
# .venv/bin/python, else python3). tests/deploy/test_openapi_drift.py runs --check.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENAPI_PYTHON_CLIENT_VERSION=0.29.1
RUFF_VERSION=0.17.5   # formats the generated code; a different ruff would format it differently
VENV=${OPENAPI_CLIENT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/softknn/openapi-client-venv}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT=clients/python
CHECK=0
case "${1:-}" in
  "") ;;
  --check) CHECK=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

have="$("$VENV/bin/openapi-python-client" --version 2>/dev/null || true); $("$VENV/bin/ruff" --version 2>/dev/null || true)"
if [ "$have" != "openapi-python-client version: $OPENAPI_PYTHON_CLIENT_VERSION; ruff $RUFF_VERSION" ]; then
  echo "== installing openapi-python-client $OPENAPI_PYTHON_CLIENT_VERSION and ruff $RUFF_VERSION into $VENV" >&2
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "openapi-python-client==$OPENAPI_PYTHON_CLIENT_VERSION" "ruff==$RUFF_VERSION"
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The generator's settings. Post-hooks spelled out (not the generator's defaults) so that a new
# generator release cannot change the formatting silently; ruff reads the generated pyproject.toml.
cat >"$WORK/config.yaml" <<'EOF'
project_name_override: softknn-client
package_name_override: softknn_client
literal_enums: true
post_hooks:
  - "ruff check --fix-only ."
  - "ruff format ."
EOF

SPEC=openapi.json
if [ "$CHECK" = 1 ]; then
  HF_HUB_OFFLINE=1 "$PYTHON" -m scripts.export_openapi --check   # exits 1 when openapi.json is stale
else
  HF_HUB_OFFLINE=1 "$PYTHON" -m scripts.export_openapi
fi

# The generator runs in $WORK, so no config of this repository's (or of the caller's) applies. It
# collects a literal enum's values in a set, so their order follows Python's string hashing: a
# fixed hash seed makes the output the same on every run.
(
  cd "$WORK"
  PYTHONHASHSEED=0 PATH="$VENV/bin:$PATH" "$VENV/bin/openapi-python-client" generate --path "$OLDPWD/$SPEC" \
    --meta pdm --config config.yaml --output-path client --fail-on-warning >generate.log 2>&1 \
    || { cat generate.log >&2; exit 1; }
)
rm -rf "$WORK/client/.ruff_cache"

EXCLUDE=(-x __pycache__ -x '*.egg-info' -x .ruff_cache -x build -x dist -x .venv -x .pdm-build)  # install artefacts (an editable install makes .pdm-build)
if [ "$CHECK" = 1 ]; then
  if ! diff -r "${EXCLUDE[@]}" "$OUT" "$WORK/client" >"$WORK/diff.txt"; then
    head -c 20000 "$WORK/diff.txt" >&2
    echo "$OUT is stale: run 'bash scripts/gen_client.sh' and commit the result" >&2
    exit 1
  fi
  echo "$OUT matches openapi.json"
  exit 0
fi

mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.old"
[ -e "$OUT" ] && mv "$OUT" "$OUT.old"
mv "$WORK/client" "$OUT"
rm -rf "$OUT.old"
echo "generated $OUT from $SPEC (openapi-python-client $OPENAPI_PYTHON_CLIENT_VERSION, ruff $RUFF_VERSION)"
