#!/usr/bin/env bash
# Benchmarks 2, 3 and 4 on a CUDA machine in about 5 minutes; writes bench/results/*_gpu.json + .png.
#
#   bash bench/gpu.sh                 # from the repository root, with ../shared/data beside it
#
# Makes a venv ($SOFTKNN_GPU_VENV, default /tmp/softknn-venv-gpu, outside the tree) with CUDA torch
# and faiss-gpu (the project's `gpu` extra) from PyPI, unless that venv already imports both with a
# GPU visible. Then: the KB (bench/kb.py: real 10k bundle, real embedding pool, noisy replicas
# beyond), the fused forward at 10k/100k/1M (flat, hnsw), ANN quality/speed at 100k/1M, and the
# service (softknn vs the naive service; peers only if their venvs exist under $SOFTKNN_PEERS). Each step has its own time limit, so one slow step
# cannot eat the others'. The same scripts as on CPU; only the device differs (bench.kb.device()).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SOFTKNN_GPU_VENV:-/tmp/softknn-venv-gpu}
export HF_HUB_OFFLINE=1 SOFTKNN_BENCH_CACHE=${SOFTKNN_BENCH_CACHE:-/tmp/softknn-bench-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

ok() { "$VENV/bin/python" -c 'import torch, faiss; assert torch.cuda.is_available() and faiss.get_num_gpus() > 0' 2>/dev/null; }
if ! ok; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # PyPI's Linux torch wheel is the CUDA build; the project pins the version
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q -e '.[gpu]' matplotlib httpx
  # faiss-cpu (a core dependency) and faiss-gpu (the gpu extra) write the same `faiss` module:
  # remove faiss-cpu, then lay faiss-gpu's files down again
  "$VENV/bin/pip" uninstall -q -y faiss-cpu
  "$VENV/bin/pip" install -q --force-reinstall --no-deps faiss-gpu
  ok || { echo "CUDA torch / faiss-gpu not usable in $VENV" >&2; exit 1; }
fi
PY="$VENV/bin/python"
step() { local limit=$1; shift; echo "== $* (limit ${limit}s)"; timeout "$limit" "$PY" -m "$@" || echo "!! $* failed or timed out (rc $?)"; }

# 300 s in all; the fused step builds (and caches) the HNSW indexes the ANN step reuses
step 60  bench kb --real 10000
step 120 bench fused_forward --sizes 10000,100000,1000000 --kinds flat,hnsw --repeats 15 --name fused_forward_gpu
step 75  bench ann --sizes 100000,1000000 --queries 200 --delta-queries 10 --name ann_gpu
step 45  bench service --clients 1,4,16,64 --duration 4 --sequential 30 --peers "${SOFTKNN_PEERS:-/nonexistent}" --name service_gpu
ls -l bench/results/*_gpu.*
