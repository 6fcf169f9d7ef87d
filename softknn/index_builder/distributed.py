"""The builder's encode step on Ray Data: the model passes run on a Ray cluster's workers, the
bundle is written here by the same writer, byte for byte the bundle a local build writes.

How it stays byte-identical (tests/builder/test_distributed.py checks every file's sha256):
- the batches are the builder's own (`pipeline._batches`: chunks sorted by token length, cut every
  `batch_size`): one Ray Data row is one whole model batch (`batch_size=1`, one block per row), so
  Ray's block splitting never changes which chunks are padded together;
- every worker runs `pipeline.encode_batch`, the function the local build runs, on the same model
  weights (each worker checks the driver's weight fingerprint before encoding);
- the arrays travel as one .npz per batch (numpy's format, no pickles) and the driver writes each batch's shard with
  `pipeline.write_shard`; assembly, FAISS, BM25, calibration and the manifest are the local code.

Float round-off of a model pass can depend on the CPU's kernels (instruction set); the same image
on the same kind of CPU gives the same bytes. Thread count does not change them (measured: 1, 2
and 3 torch threads give identical keys/values/embeddings on the sample KB).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import numpy as np

from softknn.common.errors import BundleError
from softknn.index_builder.chunker import Chunk
from softknn.index_builder.pipeline import BuildConfig, encode_batch
from softknn.model.encoder import DEFAULT_MODEL, Encoder, resolve_model_path

log = logging.getLogger(__name__)


def _arrays(npz: bytes) -> dict[str, np.ndarray]:
    """A worker's .npz back into the shard's arrays, in the worker's order (allow_pickle=False)."""
    with np.load(io.BytesIO(npz), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


class _EncodeWorker:
    """A Ray Data actor: loads the model once, then encodes whole builder batches."""

    def __init__(self, model: str | None, fingerprint: str, layer: int, cfg: BuildConfig, threads: int,
                 placement=None):
        import ray
        import torch

        if placement is not None:  # where this worker was placed, whether or not it gets a batch
            ray.get(placement.add.remote(ray.get_runtime_context().get_node_id()))

        torch.set_num_threads(threads)
        self.encoder = Encoder(model)
        if self.encoder.info.fingerprint != fingerprint:
            raise BundleError(f"{self.encoder.path}: this worker's model weights differ from the driver's "
                              f"(fingerprint {self.encoder.info.fingerprint[:16]} ≠ {fingerprint[:16]}); "
                              "every node must run the same softknn image")
        self.layer, self.cfg = layer, cfg

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        numbers, payloads = batch["batch"].tolist(), batch["payload"].tolist()
        arrays = []  # per row: the shard's arrays as one .npz of .npy members (names kept, no pickles)
        for payload in payloads:
            item = json.loads(payload)
            buf = io.BytesIO()
            np.savez(buf, **encode_batch(self.encoder, item["texts"], item["starts"], self.layer, self.cfg))  # type: ignore[arg-type]  # numpy stubs: savez(**arrays)
            arrays.append(buf.getvalue())
        return {"batch": np.asarray(numbers, dtype=np.int64), "arrays": np.asarray(arrays, dtype=object)}


class _Placement:
    """The Ray node ids the encode workers were placed on (each worker adds its own at start)."""

    def __init__(self):
        self.nodes: list[str] = []

    def add(self, node: str) -> None:
        self.nodes.append(node)

    def get(self) -> list[str]:
        return self.nodes


class RayEncode:
    """`build_bundle(..., encode=RayEncode(...))`: encode with Ray Data on a cluster.

    address: a running cluster (`ray start --head` prints it; "auto", "HOST:PORT", "ray://HOST:10001");
    None starts a local one for this build and stops it after. workers: encoder actors (default: one
    per `cpus_per_worker` CPUs of the cluster, at most one per batch); each holds its own model copy.
    """

    def __init__(self, address: str | None = None, *, workers: int | None = None, cpus_per_worker: int = 1,
                 progress: bool = False):
        if workers is not None and workers < 1:
            raise ValueError("workers must be at least 1")
        if cpus_per_worker < 1:
            raise ValueError("cpus_per_worker must be at least 1")
        self.address, self.workers, self.cpus_per_worker, self.progress = address, workers, cpus_per_worker, progress
        self.nodes: set[str] = set()  # after a run: the Ray node ids the workers were placed on
        self.workers_used = 0
        self.start_timeout_s = 600.0  # every worker must have started (model loaded) within this

    def __call__(self, encoder: Encoder, chunks: list[Chunk], batches: list[tuple[int, list[int]]], layer: int,
                 cfg: BuildConfig) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        if not batches:
            return
        import ray

        started = not ray.is_initialized()
        if started:
            # "local": a fresh cluster of this process, never one another program happens to run here
            # (ray.init() without an address would join the machine's most recently started cluster)
            ray.init(address=self.address or "local", include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        try:
            yield from self._run(encoder, chunks, batches, layer, cfg)
        finally:
            if started:
                ray.shutdown()

    def _run(self, encoder, chunks, batches, layer, cfg):
        import ray
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = self.progress
        ctx.enable_operator_progress_bars = self.progress
        # the pool starts every worker before the first batch: each reports its node (self.nodes), and
        # a cluster without room for them fails after the timeout instead of waiting forever
        ctx.wait_for_min_actors_s = int(self.start_timeout_s)
        placement = ray.remote(_Placement).options(num_cpus=0).remote()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        workers = self.workers or max(1, cpus // self.cpus_per_worker)
        workers = min(workers, len(batches))
        self.workers_used, self.nodes = workers, set()
        items = [{"batch": s, "payload": json.dumps({"texts": [chunks[r].text for r in rows],
                                                     "starts": [chunks[r].start for r in rows]}, ensure_ascii=False)}
                 for s, rows in batches]
        # packaged weights: each node resolves its own copy of the package (the fingerprint check
        # proves it is the same); a model path must exist at the same path on every node
        model = None if encoder.path == resolve_model_path(DEFAULT_MODEL) else encoder.path
        ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            _EncodeWorker,
            fn_constructor_kwargs={"model": model, "fingerprint": encoder.info.fingerprint, "layer": layer,
                                   "cfg": cfg, "threads": self.cpus_per_worker, "placement": placement},
            batch_size=1,  # one row = one builder batch: the padding is the local build's
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=self.cpus_per_worker,
        )
        log.info("encoding %d batches on %d Ray workers (%d CPUs in the cluster)", len(batches), workers, cpus)
        seen = set()
        try:
            for row in ds.iter_rows():
                s = int(row["batch"])
                seen.add(s)
                yield s, _arrays(row["arrays"])
            self.nodes = set(ray.get(placement.get.remote()))
        except ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, BundleError):
                raise BundleError(str(cause)) from e
            raise BundleError(f"distributed encode failed: {e}") from e
        finally:
            ray.kill(placement)
        missing = {s for s, _ in batches} - seen
        if missing:  # never assemble a bundle without some of its chunks
            raise BundleError(f"distributed encode returned no result for {len(missing)} batches")
