#!/usr/bin/env bash
# CI step: build the CPU image (docker/Dockerfile) with podman for real and smoke-test it in the
# order docker-compose.yml runs it, with plain `podman run` (podman-compose ignores depends_on
# conditions here; see ../shared/CONTAINERS.md):
#   1. builder: `softknn build /kb --out /bundles/current` on the image's sample KB, into a named
#      volume, with no network (the model comes from the image, nothing is downloaded)
#   2. service: the image's default command on that volume mounted read-only
#   3. GET /readyz (bounded wait), one POST /v1/infer with evidence, the process's uid is not 0,
#      `podman healthcheck run` (the image's HEALTHCHECK) reports healthy
# Works from a fresh Debian 12 machine as root: installs podman/runc/debootstrap, makes a local
# Debian base image with debootstrap (no registry is reachable), fetches the CPU torch wheel into
# docker/wheels. Layers are cached by podman between runs (same machine): a warm run rebuilds
# only what changed. Exits non-zero on any failure; every wait is bounded.
#
# Env: SMOKE_PORT (host port, default: a free one), SMOKE_IMAGE (default localhost/softknn:smoke),
#      SMOKE_WORK (scratch, default /var/tmp/softknn-smoke), SMOKE_BUILD_TIMEOUT (s, 2400),
#      SMOKE_READY_TIMEOUT (s, 300), SMOKE_KEEP=1 (leave the containers and volume for a look),
#      TORCH_PIP_ARGS (extra `pip download` args for the torch CPU wheel, e.g. an index URL),
#      SMOKE_BUILD_ONLY=1 (stop once the image is built and checked: scripts/ray_compose_smoke.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

IMG=${SMOKE_IMAGE:-localhost/softknn:smoke}
WORK=${SMOKE_WORK:-/var/tmp/softknn-smoke}
BUILD_TIMEOUT=${SMOKE_BUILD_TIMEOUT:-2400}
READY_TIMEOUT=${SMOKE_READY_TIMEOUT:-300}
BASE_IMG=localhost/debian:bookworm
VOL=softknn-smoke-bundles
BUILDER=softknn-smoke-builder
SVC=softknn-smoke-service
TORCH_REQ='torch==2.13.0+cpu'
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
# a free loopback port unless one is given
PORT=${SMOKE_PORT:-$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

mkdir -p "$WORK"
t0=$(date +%s)
lap() { echo "[smoke $(( $(date +%s) - t0 ))s] $*"; }
die() { echo "[smoke $(( $(date +%s) - t0 ))s] FAIL: $*" >&2; exit 1; }

# --- 1. tools (no-op when installed)
export DEBIAN_FRONTEND=noninteractive
if ! { command -v podman && command -v runc && command -v debootstrap; } >/dev/null; then
  timeout 300 apt-get update -q >/dev/null
  timeout 900 apt-get install -y -q podman runc debootstrap >/dev/null
fi
lap "tools: $(podman --version)"

# --- 2. podman settings this kind of VM needs: crun fails (no CAP_SYS_RESOURCE, hybrid cgroups),
# runc works; nproc above 32768 fails.
cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$WORK/containers.conf"

# --- 3. local base image: Debian 12 minbase + this machine's extra CA certificates (package
# registries are reached through a TLS proxy). Made once, kept in podman's storage.
if ! podman image exists "$BASE_IMG"; then
  rootfs="$WORK/rootfs"
  rm -rf "$rootfs"
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '$1=="deb"{print $2; exit}' || true)
  [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/{print $2; exit}' || true)
  timeout 1200 debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" ${mirror:+"$mirror"} \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; die "debootstrap"; }
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$rootfs" update-ca-certificates >>"$WORK/debootstrap.log" 2>&1
  cp /etc/apt/sources.list "$rootfs/etc/apt/sources.list" 2>/dev/null || true
  cp -r /etc/apt/sources.list.d/. "$rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
         "$rootfs"/var/cache/apt/*.bin "$rootfs/etc/hostname"
  : >"$rootfs/etc/resolv.conf"
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE_IMG" >>"$WORK/debootstrap.log" 2>&1
  rm -rf "$rootfs"
  lap "base image $BASE_IMG made"
fi
lap "base image: $(podman image inspect "$BASE_IMG" --format '{{.Size}}') bytes"

# --- 4. the CPU torch wheel the Dockerfile installs from docker/wheels (git-ignored)
if ! ls docker/wheels/torch-2.13.0+cpu-cp311-*.whl >/dev/null 2>&1; then
  mkdir -p docker/wheels
  # shellcheck disable=SC2086  # TORCH_PIP_ARGS is a list of pip arguments
  timeout 900 "$PY" -m pip download -q --no-deps "$TORCH_REQ" -d docker/wheels ${TORCH_PIP_ARGS:-} \
    || die "pip download $TORCH_REQ (docs/docker.md: where the CPU wheel comes from)"
fi
lap "torch wheel: $(basename docker/wheels/torch-2.13.0+cpu-cp311-*.whl)"

# --- 5. build (docker format: the OCI format drops HEALTHCHECK)
lap "building $IMG (log: $WORK/build.log)"
timeout "$BUILD_TIMEOUT" podman build --format docker --layers --build-arg BASE="$BASE_IMG" \
    -f docker/Dockerfile -t "$IMG" . >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; die "podman build (exit $?)"; }
# Bound the storage that repeated builds leave: tag the deps and app stages (the final image does
# not descend from them, and their layers are the cache worth keeping; both builds are cache hits),
# then drop the untagged images of older builds.
for stage in deps app; do
  timeout 600 podman build --format docker --layers --build-arg BASE="$BASE_IMG" --target "$stage" \
      -f docker/Dockerfile -t "$IMG-$stage" . >>"$WORK/build.log" 2>&1 || die "podman build --target $stage"
done
# Housekeeping only: an image still held by a build container that a killed build left behind
# makes prune fail, and that is no reason to fail the smoke test.
podman image prune -f >/dev/null 2>&1 || lap "podman image prune failed (an old build container holds an image); continuing"
size=$(podman image inspect "$IMG" --format '{{.Size}}')
lap "built $IMG: $(( size / 1000000 )) MB"
user=$(podman image inspect "$IMG" --format '{{.Config.User}}')
case "$user" in ""|root|0|0:*|root:*) die "image runs as root (User='$user')";; esac
hc=$(podman image inspect "$IMG" --format '{{.HealthCheck}}')
case "$hc" in *readyz*) ;; *) die "image has no HEALTHCHECK on /readyz ($hc)";; esac
lap "image config: user $user, healthcheck kept"
[ "${SMOKE_BUILD_ONLY:-0}" = 1 ] && { lap "built only (SMOKE_BUILD_ONLY=1)"; exit 0; }

# --- 6. builder, then service, as compose orders them
cleanup() {
  [ "${SMOKE_KEEP:-0}" = 1 ] && return 0
  podman rm -f -t 5 "$SVC" "$BUILDER" >/dev/null 2>&1 || true
  podman volume rm -f "$VOL" >/dev/null 2>&1 || true
}
trap cleanup EXIT
podman rm -f -t 5 "$SVC" "$BUILDER" >/dev/null 2>&1 || true
podman volume rm -f "$VOL" >/dev/null 2>&1 || true
podman volume create "$VOL" >/dev/null

timeout 900 podman run --rm --name "$BUILDER" --network none -v "$VOL:/bundles" "$IMG" \
    build /kb --out /bundles/current --force --no-progress >"$WORK/builder.log" 2>&1 \
  || { tail -30 "$WORK/builder.log"; die "builder job"; }
lap "builder: $(grep '^built ' "$WORK/builder.log" || tail -1 "$WORK/builder.log")"

# (podman warns on stderr that it cannot schedule healthchecks without systemd: expected here,
# the check is run on demand below)
podman run -d --name "$SVC" -v "$VOL:/bundles:ro" -p "127.0.0.1:$PORT:8000" "$IMG" >/dev/null 2>"$WORK/run.err" \
  || { cat "$WORK/run.err" >&2; die "podman run service"; }

# HTTP from the host with the stdlib: prints "STATUS BODY"; never raises on HTTP errors.
http() {  # http METHOD URL [JSON_BODY]
  "$PY" - "$@" <<'EOF'
import sys, urllib.error, urllib.request
method, url, body = sys.argv[1], sys.argv[2], (sys.argv[3].encode() if len(sys.argv) > 3 else None)
req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, e)
EOF
}
base="http://127.0.0.1:$PORT"
deadline=$(( $(date +%s) + READY_TIMEOUT ))
ready=
while [ "$(date +%s)" -lt "$deadline" ]; do
  out=$(http GET "$base/readyz")
  [ "${out%% *}" = 200 ] && { ready=$out; break; }
  [ "$(podman inspect "$SVC" --format '{{.State.Running}}')" = true ] \
    || { podman logs --tail 40 "$SVC" >&2; die "service container exited before ready"; }
  sleep 2
done
[ -n "$ready" ] || { podman logs --tail 40 "$SVC" >&2; die "/readyz not 200 within ${READY_TIMEOUT}s (last: $out)"; }
lap "GET /readyz -> $ready"
out=$(http GET "$base/healthz"); [ "${out%% *}" = 200 ] || die "GET /healthz -> $out"

out=$(http POST "$base/v1/infer" '{"inputs": ["Can I bring my bicycle on the ferry?"], "evidence": 3}')
[ "${out%% *}" = 200 ] || { podman logs --tail 20 "$SVC" >&2; die "POST /v1/infer -> $out"; }
summary=$(printf '%s' "${out#* }" | "$PY" -c '
import json, sys
r = json.load(sys.stdin)
res = r["results"]
assert len(res) == 1, f"{len(res)} results for 1 input"
ev = res[0]["evidence"]
assert 1 <= len(ev) <= 3, f"{len(ev)} evidence items (asked for 3)"
top = ev[0]
assert top["text"] and top["chunk_id"] and 0 < top["weight"] <= 1, top
cid, w, text = top["chunk_id"], top["weight"], top["text"][:60]
print(f"{len(ev)} evidence items, top {cid} (w_db {w:.3f}): {text!r}")
') || die "POST /v1/infer: unexpected body: ${out:0:400}"
lap "POST /v1/infer: $summary"

uid=$(timeout 60 podman exec "$SVC" id -u) || die "podman exec id -u"
[ "$uid" != 0 ] || die "service process runs as root"
lap "service runs as uid $uid"

# object storage (`--bundle s3://…`, `softknn fetch`): the image carries the `remote` extra
timeout 60 podman exec "$SVC" /opt/venv/bin/python -c 'import s3fs, softknn.storage.remote as r; assert r.is_remote("s3://b/kb")' \
  || die "the image cannot serve from object storage (s3fs missing)"
lap "s3fs importable in the image"

# the decode attention kernel compiles in the image, as the service user (generator.attention auto)
kern=$(timeout 120 podman exec "$SVC" /opt/venv/bin/python -c 'import tempfile; from pathlib import Path
from softknn.generate import kernel
k, why = kernel.load(Path(tempfile.mkdtemp()))
assert k is not None, why
print(why)') || die "the attention kernel does not build in the image: $kern"
lap "attention kernel built: $kern"

timeout 60 podman healthcheck run "$SVC" >/dev/null \
  || die "podman healthcheck run: $(podman inspect "$SVC" --format '{{.State.Health.Status}}')"
lap "HEALTHCHECK: $(podman inspect "$SVC" --format '{{.State.Health.Status}}')"
lap "OK"
