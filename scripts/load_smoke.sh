#!/usr/bin/env bash
# CI step: a short load test of a real `softknn serve` through the generated client. Builds the sample
# bundle, serves it on a free port of 127.0.0.1, waits for /readyz, runs `python -m loadtest.run`
# (locust, headless; default 8 users for 30 s), stops the server. Exits non-zero on any unexpected
# answer (an expected 4xx of the deliberately invalid requests is a success), or if the server does
# not get ready.
#
#   bash scripts/load_smoke.sh                                     the CI smoke run (8 users, 30 s)
#   LOAD_USERS=16 LOAD_DURATION=120 bash scripts/load_smoke.sh     the longer run of docs/loadtest.md
#   LOAD_BUNDLE=DIR LOAD_LEVELS=1,4,16 LOAD_GENERATION=only LOAD_DURATION=60 bash scripts/load_smoke.sh
#                                                                  generation at 1, 4 and 16 users
#
# The sample bundle has no generator, so the CI run leaves the generation tasks out (docs/loadtest.md
# says why); a generator bundle given as LOAD_BUNDLE brings them in.
#
# Env: LOAD_USERS (8), LOAD_DURATION (30 s), LOAD_OUT (build/load-smoke: summary.json/.csv, server.log),
# LOAD_LEVELS (user counts run one after another, e.g. 1,4,16: per-level summaries and levels.json/.csv),
# LOAD_GENERATION (auto | only | off, loadtest.run's --generation; with a generator, one warm-up
# generation runs first), LOAD_BUNDLE (serve this bundle instead of building the sample one),
# SOFTKNN_MODEL__THREADS (1: the other core drives the load), LOADTEST_VENV (default
# ${XDG_CACHE_HOME:-~/.cache}/softknn/loadtest-venv: locust and the client's dependencies from
# loadtest/requirements.txt, kept between runs; locust stays out of the project venv, as in
# docker/Dockerfile.loadtest), PYTHON (the project's interpreter, default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

USERS=${LOAD_USERS:-8}
DURATION=${LOAD_DURATION:-30}
GENERATION=${LOAD_GENERATION:-auto}
if [ -n "${LOAD_LEVELS:-}" ]; then LOAD=(--levels "$LOAD_LEVELS"); else LOAD=(--users "$USERS"); fi
OUT=${LOAD_OUT:-build/load-smoke}
VENV=${LOADTEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/softknn/loadtest-venv}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
softknn() { "$PYTHON" -c 'from softknn.cli import app; app(prog_name="softknn")' "$@"; }  # the `softknn` command

# 1. the load generator's venv (reinstalled when loadtest/requirements.txt changes)
stamp="$VENV/.requirements.sha256"
want=$(sha256sum loadtest/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing loadtest/requirements.txt into $VENV"
  python3 -m venv "$VENV"
  timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r loadtest/requirements.txt
  echo "$want" >"$stamp"
fi
# The committed client, straight from the tree (its dependencies are in the venv): always the current one.
export PYTHONPATH="$PWD/clients/python${PYTHONPATH:+:$PYTHONPATH}"

# 2. the bundle
if [ -n "${LOAD_BUNDLE:-}" ]; then
  BUNDLE=$LOAD_BUNDLE
else
  BUNDLE="$OUT/sample-bundle"
  echo "== building the sample bundle into $BUNDLE"
  softknn build "$(softknn sample-kb)" --out "$BUNDLE" --force --no-progress
fi

# 3. the server, on a free port of 127.0.0.1
PORT=$("$PYTHON" -c 'from tests.harness import free_port; print(free_port())')
URL="http://127.0.0.1:$PORT"
SOFTKNN_MODEL__THREADS=${SOFTKNN_MODEL__THREADS:-1} "$PYTHON" -c 'from softknn.cli import app; app(prog_name="softknn")' \
  serve --bundle "$BUNDLE" --host 127.0.0.1 --port "$PORT" --log-level warning >"$OUT/server.log" 2>&1 &
SERVER=$!
stop_server() {
  if kill -0 "$SERVER" 2>/dev/null; then
    kill "$SERVER"
    for _ in $(seq 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
    kill -9 "$SERVER" 2>/dev/null || true
  fi
}
trap stop_server EXIT

echo "== waiting for $URL/readyz (server pid $SERVER)"
if ! "$PYTHON" -m tests.harness wait-ready "$URL" --pid "$SERVER" --timeout 240
then
  echo "server log:"; tail -n 60 "$OUT/server.log"
  exit 1
fi

# 4. the load test
set +e
"$VENV/bin/python" -m loadtest.run --host "$URL" "${LOAD[@]}" --duration "$DURATION" --generation "$GENERATION" \
  --warmup --out "$OUT"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "load test failed (exit $rc); server log:"; tail -n 60 "$OUT/server.log"
  exit "$rc"
fi
echo "load smoke: OK (${LOAD_LEVELS:-$USERS} users, $DURATION s; summary in $OUT)"
