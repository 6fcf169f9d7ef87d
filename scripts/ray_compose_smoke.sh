#!/usr/bin/env bash
# The compose file's `ray` profile run for real with podman, in the order compose runs it, with
# plain `podman run` (podman-compose ignores depends_on conditions here: ../shared/CONTAINERS.md):
#   1. the CPU image (scripts/container_smoke.sh SMOKE_BUILD_ONLY=1: tools, base image, torch wheel, build)
#   2. builder and ray-builder jobs into one volume: /bundles/current (one index) and /bundles/sharded
#      (2 shards), with no network
#   3. ray-head, then 2 ray-workers, on one podman network, each running exactly the shell command
#      docker-compose.yml gives it (read from the file, compose's defaults filled in), with the Ray
#      token as a read-only file at /run/secrets/ray_auth_token
#   4. checks: /readyz 200 once the head has its 3 nodes; the cluster has 3 live nodes and the shard
#      actors run on the workers; POST /v1/infer exact equals `softknn query --json --exact` on the
#      unsharded bundle inside the same image (embedding within 1e-6, the same evidence ids and order);
#      the worker holding a shard removed: that shard comes back on a node that is left (Ray restarts
#      it) and the answer is exact again
# Exits non-zero on any failure; every wait is bounded.
# Env: RAY_SMOKE_PORT (host port, default: a free one), RAY_SMOKE_WORK (default /var/tmp/softknn-ray-smoke),
#      RAY_SMOKE_READY_TIMEOUT (s, 900), RAY_SMOKE_KEEP=1 (leave containers, network and volume),
#      SMOKE_IMAGE (default localhost/softknn:smoke, shared with container_smoke.sh's cache).
set -euo pipefail
cd "$(dirname "$0")/.."

IMG=${SMOKE_IMAGE:-localhost/softknn:smoke}
WORK=${RAY_SMOKE_WORK:-/var/tmp/softknn-ray-smoke}
READY_TIMEOUT=${RAY_SMOKE_READY_TIMEOUT:-900}
NET=softknn-ray-smoke
VOL=softknn-ray-smoke-bundles
HEAD=softknn-ray-smoke-head
WORKERS=(softknn-ray-smoke-worker-1 softknn-ray-smoke-worker-2)
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
PORT=${RAY_SMOKE_PORT:-$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
QUERY="Can I bring my bicycle on the ferry?"

mkdir -p "$WORK"
t0=$(date +%s)
lap() { echo "[ray-smoke $(( $(date +%s) - t0 ))s] $*"; }
die() { echo "[ray-smoke $(( $(date +%s) - t0 ))s] FAIL: $*" >&2; exit 1; }

# --- 1. the image (and podman's settings for this VM, which container_smoke.sh writes)
SMOKE_BUILD_ONLY=1 SMOKE_IMAGE="$IMG" SMOKE_WORK="$WORK/image" bash scripts/container_smoke.sh >"$WORK/image.log" 2>&1 \
  || { tail -30 "$WORK/image.log"; die "image build (scripts/container_smoke.sh)"; }
export CONTAINERS_CONF="$WORK/image/containers.conf"
lap "image $IMG ready ($(grep -c . "$WORK/image.log") log lines)"

# the compose services' shell commands, compose's ${VAR:-default} filled in
compose_cmd() {  # compose_cmd SERVICE
  "$PY" - "$1" <<'EOF'
import re, sys, yaml
s = yaml.safe_load(open("docker-compose.yml"))["services"][sys.argv[1]]
print(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", s["command"][0]).replace("$$", "$"))
EOF
}
ray_builder_args() {
  "$PY" - <<'EOF'
import re, yaml
s = yaml.safe_load(open("docker-compose.yml"))["services"]["ray-builder"]
print("\n".join(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", x) for x in s["command"]))
EOF
}

cleanup() {
  [ "${RAY_SMOKE_KEEP:-0}" = 1 ] && return 0
  podman rm -f -t 5 "$HEAD" "${WORKERS[@]}" >/dev/null 2>&1 || true
  podman network rm -f "$NET" >/dev/null 2>&1 || true
  podman volume rm -f "$VOL" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
podman volume create "$VOL" >/dev/null
podman network create "$NET" >/dev/null
(umask 022; "$PY" -c 'import secrets; print(secrets.token_hex(32))' > "$WORK/ray_auth_token")
SECRET=(-v "$WORK/ray_auth_token:/run/secrets/ray_auth_token:ro")
ENV=(-e SOFTKNN_MODEL__THREADS=1 -e HF_HUB_OFFLINE=1)

# --- 2. the two builder jobs
timeout 900 podman run --rm --network none -v "$VOL:/bundles" "$IMG" \
    build /kb --out /bundles/current --force --no-progress >"$WORK/builder.log" 2>&1 \
  || { tail -30 "$WORK/builder.log"; die "builder job"; }
mapfile -t RB < <(ray_builder_args)
timeout 900 podman run --rm --network none -v "$VOL:/bundles" "$IMG" "${RB[@]}" >"$WORK/ray-builder.log" 2>&1 \
  || { tail -30 "$WORK/ray-builder.log"; die "ray-builder job"; }
lap "builders: $(grep '^built ' "$WORK/builder.log" | head -1); $(grep '^built ' "$WORK/ray-builder.log" | head -1)"

# --- 3. head, then workers (compose: workers depend on the head having started; they restart
# until the head's GCS answers, which here is waited for instead)
podman run -d --name "$HEAD" --hostname ray-head --network "$NET" --network-alias ray-head --shm-size 2g \
    -v "$VOL:/bundles:ro" "${SECRET[@]}" "${ENV[@]}" -p "127.0.0.1:$PORT:8000" \
    --entrypoint /bin/sh "$IMG" -c "$(compose_cmd ray-head)" >/dev/null 2>"$WORK/run.err" \
  || { cat "$WORK/run.err" >&2; die "podman run ray-head"; }
end=$(( $(date +%s) + 300 ))
until podman logs "$HEAD" 2>&1 | grep -q "Ray runtime started"; do
  [ "$(podman inspect "$HEAD" --format '{{.State.Running}}')" = true ] \
    || { podman logs --tail 40 "$HEAD" >&2; die "ray-head exited"; }
  [ "$(date +%s)" -lt "$end" ] || { podman logs --tail 40 "$HEAD" >&2; die "ray-head: no Ray runtime in 300 s"; }
  sleep 2
done
lap "ray-head: Ray head up"
for w in "${WORKERS[@]}"; do
  podman run -d --name "$w" --network "$NET" --shm-size 2g -v "$VOL:/bundles:ro" "${SECRET[@]}" "${ENV[@]}" \
      --entrypoint /bin/sh "$IMG" -c "$(compose_cmd ray-worker)" >/dev/null 2>>"$WORK/run.err" \
    || { cat "$WORK/run.err" >&2; die "podman run $w"; }
done
lap "ray-workers started: ${WORKERS[*]}"

http() {  # http METHOD URL [JSON_BODY]: prints "STATUS BODY"
  "$PY" - "$@" <<'EOF'
import sys, urllib.error, urllib.request
method, url, body = sys.argv[1], sys.argv[2], (sys.argv[3].encode() if len(sys.argv) > 3 else None)
req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=120) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, e)
EOF
}
base="http://127.0.0.1:$PORT"
wait_ready() {  # wait_ready SECONDS
  local deadline=$(( $(date +%s) + $1 )) out=
  while [ "$(date +%s)" -lt "$deadline" ]; do
    out=$(http GET "$base/readyz")
    [ "${out%% *}" = 200 ] && { echo "$out"; return 0; }
    [ "$(podman inspect "$HEAD" --format '{{.State.Running}}')" = true ] \
      || { podman logs --tail 60 "$HEAD" >&2; die "ray-head exited before ready"; }
    sleep 3
  done
  podman logs --tail 60 "$HEAD" >&2
  die "/readyz not 200 within $1 s (last: $out)"
}
r=$(wait_ready "$READY_TIMEOUT") || die "not ready"
lap "GET /readyz -> $r"

# --- 4. checks
placement() {  # the cluster's live nodes and where each shard actor runs, as JSON
  timeout 120 podman exec -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/secrets/ray_auth_token "$HEAD" \
      python -c '
import json, ray
from ray._private.state import actors
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
head = ray.get_runtime_context().get_node_id()
out = {}
for a in ray.util.list_named_actors(all_namespaces=True):
    if a["name"].startswith("softknn-shard-"):
        info = actors(ray.get_actor(a["name"], namespace=a["namespace"])._actor_id.hex())
        node = info["Address"]["NodeID"]
        out[a["name"]] = {"state": info["State"], "on_head": node == head, "ip": nodes.get(node)}
print(json.dumps({"nodes": len(nodes), "shards": out}))
' 2>/dev/null | tail -1
}
p=$(placement) || die "placement query"
lap "placement: $p"
printf '%s' "$p" | "$PY" -c '
import json, sys
p = json.load(sys.stdin)
assert p["nodes"] == 3, p
assert len(p["shards"]) == 2 and all(s["state"] == "ALIVE" for s in p["shards"].values()), p
assert not all(s["on_head"] for s in p["shards"].values()), f"every shard actor on the head: {p}"
' || die "placement: $p"

exact_check() {  # the service's exact answer against softknn query --json --exact on /bundles/current
  local got want
  got=$(http POST "$base/v1/infer" "{\"inputs\": [\"$QUERY\"], \"exact\": true, \"k\": 8}")
  [ "${got%% *}" = 200 ] || die "POST /v1/infer exact -> ${got:0:400}"
  want=$(timeout 300 podman exec -e SOFTKNN_MODEL__THREADS=1 "$HEAD" softknn query /bundles/current "$QUERY" \
      --json --exact --k 8 2>/dev/null) || die "softknn query in the head container"
  printf '%s\n%s' "${got#* }" "$want" | "$PY" -c '
import json, sys
got, want = (json.loads(x) for x in sys.stdin.read().split("\n", 1))
a = got["results"][0]
b = want["results"][0] if "results" in want else want[0]
d = max(abs(x - y) for x, y in zip(a["embedding"], b["embedding"], strict=True))
ids = [e["chunk_id"] for e in a["evidence"]], [e["chunk_id"] for e in b["evidence"]]
assert d <= 1e-6 and ids[0] == ids[1], (d, ids)
v = got["bundle_version"]
print(f"max |d embedding| {d:.2e}, evidence {ids[0][:3]}..., bundle {v}")
'
}
r=$(exact_check) || die "exact answer differs"
lap "exact answer: $r"

# the worker holding a shard removed for good: Ray restarts that shard actor on a node that is left
ip=$(printf '%s' "$p" | "$PY" -c '
import json, sys
print(next(s["ip"] for s in json.load(sys.stdin)["shards"].values() if not s["on_head"]))')
gone=
for w in "${WORKERS[@]}"; do
  [ "$(podman inspect "$w" --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}')" = "$ip" ] && gone=$w
done
[ -n "$gone" ] || die "no worker container has the shard's node address $ip"
podman rm -f -t 2 "$gone" >/dev/null 2>&1
lap "removed $gone (node $ip, which held a shard actor)"
end=$(( $(date +%s) + 300 ))
while :; do
  p=$(placement || true)
  if printf '%s' "$p" | "$PY" -c '
import json, sys
p = json.load(sys.stdin)
sys.exit(0 if p["nodes"] == 2 and len(p["shards"]) == 2 and all(s["state"] == "ALIVE" for s in p["shards"].values()) else 1)
' 2>/dev/null; then break; fi
  [ "$(date +%s)" -lt "$end" ] || die "shards not back within 300 s after a worker left: $p"
  sleep 3
done
r=$(wait_ready 300) || die "not ready after the worker left"
lap "after the worker left: $p; GET /readyz -> $r"
r=$(exact_check) || die "exact answer differs after the worker left"
lap "exact answer: $r"
lap "OK"
