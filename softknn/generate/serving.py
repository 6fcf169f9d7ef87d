"""The one place that opens generation over a bundle from the Settings, for `softknn generate` and the
service alike: the generator the settings name, else the one the bundle's generator memory was
built with (loaded once per name: `generators` is the caller's cache), run with the settings'
decode runtime, weights, threads and batch (`settings.generator`)."""

from __future__ import annotations

from softknn.common.errors import BundleError
from softknn.generate.engine import GenEngine
from softknn.generate.model import Generator
from softknn.model.backends import ModelForward
from softknn.params import Settings
from softknn.retrieval.search import Retriever


def generator_for(settings: Settings, retriever: Retriever, generators: dict[str, Generator]) -> Generator:
    """The generator that serves `retriever`'s bundle: settings.generator.name, else the bundle's own
    (a loaded one with the bundle's weights, whatever its name), loaded into `generators` once."""
    rec = retriever.bundle.manifest.generator
    if rec is None:
        raise BundleError(f"{retriever.bundle.path}: built without a generator; rebuild with --generator "
                          "smollm2-135m-instruct", field="bundle")
    name = settings.generator.name or rec.name
    gen = generators.get(name)
    if gen is None and not settings.generator.name:  # a shared generator with the bundle's weights
        gen = next((g for g in generators.values() if g.info.fingerprint == rec.fingerprint), None)
    if gen is None:
        gen = generators[name] = Generator.load(name, cache_dir=settings.generator.cache_dir)
    return gen


def gen_engine_for(settings: Settings, retriever: Retriever, encoder: ModelForward,
                   generators: dict[str, Generator] | None = None) -> GenEngine:
    """A GenEngine over `retriever`'s bundle with the settings' generator and its decode settings."""
    g = settings.generator
    gen = generator_for(settings, retriever, {} if generators is None else generators)
    return GenEngine(retriever, encoder, gen, runtime=g.runtime, weights=g.weights, threads=g.threads,
                     max_batch=g.max_concurrent, torch_concurrent=g.torch_concurrent, cache_mb=g.cache_mb,
                     kv_cache=g.kv_cache, attention=g.attention, attention_threads=g.attention_threads,
                     lanes=g.lanes)
