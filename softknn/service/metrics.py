"""Prometheus metrics, one registry per app (so several apps in one process never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("softknn_http_requests", "HTTP requests by route template, method and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("softknn_http_request_duration_seconds", "HTTP request latency by route",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("softknn_queue_depth", "texts waiting for the inference worker", registry=r)
        self.queue_wait = Histogram("softknn_queue_wait_seconds", "time a request waited before its first batch",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("softknn_batch_size", "texts per micro-batch", buckets=SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram("softknn_batch_padded_tokens", "padded tokens (texts × longest) per micro-batch",
                                      buckets=(16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384), registry=r)
        self.inference = Histogram("softknn_inference_seconds", "wall time of one micro-batch in the engine",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.memory_share = Histogram("softknn_memory_share", "memory mass share of each input's output",
                                      buckets=tuple(i / 20 for i in range(1, 21)), registry=r)
        self.rejected = Counter("softknn_rejected", "requests refused without inference, by reason",
                                ["reason"], registry=r)
        # per KB (label `kb`: the name it is served under; `default` for a single --bundle)
        self.ready = Gauge("softknn_ready", "1 when the model and the KB's bundle are loaded and warm", ["kb"],
                           registry=r)
        self.bundle = Info("softknn_bundle", "the bundle each KB serves", ["kb"], registry=r)
        self.reloads = Counter("softknn_reloads", "bundle reloads by KB and outcome", ["kb", "outcome"], registry=r)
        self.kb_writes = Counter("softknn_kb_writes", "acknowledged KB writes (durable) by KB and operation",
                                 ["kb", "op"], registry=r)
        self.model = Info("softknn_model", "the serving model and its runtime", registry=r)
        # generation (/v1/generate, /v1/chat/completions)
        self.generations = Counter("softknn_generations", "generations by finish reason (stop, length, cancelled, error)",
                                   ["finish_reason"], registry=r)
        self.generated_tokens = Counter("softknn_generated_tokens", "tokens generated", registry=r)
        self.time_to_first_token = Histogram("softknn_generation_time_to_first_token_seconds",
                                             "time from admission (slot wait included) to the first generated token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.generation_seconds = Histogram("softknn_generation_seconds", "wall time of one generation in its thread",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.generations_running = Gauge("softknn_generations_running", "generations holding a slot", registry=r)
        self.generations_waiting = Gauge("softknn_generations_waiting", "generations waiting for a slot", registry=r)
        self.generator = Info("softknn_generator", "the served generator (empty: none)", registry=r)

    def set_model(self, info) -> None:
        self.model.info({"name": info.name, "fingerprint": info.fingerprint, "runtime": info.runtime,
                         "precision": info.precision})

    def set_bundle(self, kb: str, summary: dict, model_name: str) -> None:
        self.bundle.labels(kb).info({
            "version_id": summary["version_id"],
            "path": summary["path"],
            "model": model_name,
            "index": summary["index"]["kind"],
            "chunks": str(summary["counts"]["chunks"]),
        })
