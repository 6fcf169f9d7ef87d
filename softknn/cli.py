"""The `softknn` command: parses, builds Settings, calls the packages. No logic of its own."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperArgument, TyperCommand

from softknn.common.console import fail, need_bundle, sample_kb_path
from softknn.common.errors import InputTooLarge, SoftKNNError
from softknn.common.options import table_options
from softknn.common.table import GenParams, InferParams
from softknn.params import gen_params, infer_params, settings_from


class Command(TyperCommand):
    """Usage lines in click's convention, `softknn query [OPTIONS] BUNDLE TEXTS...`, where typer ≥ 0.24
    prints a required argument as `{bundle}`."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        rv = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, TyperArgument):
                name = (p.metavar or p.name or "").upper()
                rv.append((name if p.required else f"[{name}]") + ("..." if p.nargs != 1 else ""))
            else:
                rv.extend(p.get_usage_pieces(ctx))
        return rv

app = typer.Typer(
    help="softknn: attention over a FAISS-indexed knowledge base, with evidence.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _options(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show the model loader's progress "
                                                   "bars (quiet by default)")] = False) -> None:
    """softknn: attention over a FAISS-indexed knowledge base, with evidence."""
    if not verbose:  # read when huggingface_hub is first imported, which is after this: no import here
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


_settings, _fail = settings_from, fail  # the names the commands below use


def _encoder(settings):
    """The command's encoder (softknn.model.runtime.encoder_for), imported when a command needs it."""
    from softknn.model.runtime import encoder_for

    return encoder_for(settings)


def _json_arg(text: str, option: str):
    """An option's JSON value, or InvalidInput naming the option and where the JSON breaks."""
    from softknn.common.errors import InvalidInput

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{option}: not JSON ({e})", field=option.lstrip("-")) from None


def _note(msg: str) -> None:
    typer.secho(f"note: {msg}", fg=typer.colors.YELLOW, err=True)


def _build_runtime(settings):
    """model.runtime=auto builds with torch: a bundle is the same bytes wherever it is built, and its
    K/V come from the runtime the Ray encode workers run (softknn.index_builder.distributed); an explicit
    onnx is kept. The service verifies onnx against torch at open, so either serves the bundle."""
    if settings.model.runtime == "auto":
        settings.model.runtime = "torch"
    return settings


ModelOpt = Annotated[str | None, typer.Option("--model", help="sentence-transformers model path (default: packaged all-MiniLM-L6-v2)")]


@app.command(cls=Command)
def build(
    kb: Annotated[Path, typer.Argument(help="KB: a .jsonl/.json/.csv file, or a folder of them and .txt/.md files")],
    out: Annotated[str, typer.Option("--out", "-o", help="bundle directory to write, or an object storage URI "
                                                        "(s3://bucket/kb: built in a folder beside the node's "
                                                        "cache, pushed, then removed)")],
    model: ModelOpt = None,
    layer: Annotated[int, typer.Option(help="memory layer, 0-based; -1 = last")] = -1,
    index: Annotated[str, typer.Option(help="auto | flat | hnsw | ivf | ivfpq")] = "auto",
    chunk_tokens: Annotated[int | None, typer.Option(help="tokens per chunk (default max_seq_length − 8)")] = None,
    overlap: Annotated[int, typer.Option(help="tokens shared by consecutive chunks")] = 32,
    batch_size: Annotated[int, typer.Option(help="chunks per model pass")] = 32,
    kv_dtype: Annotated[str, typer.Option(help="float32 | float16 for stored keys/values (with --memory kv)")] = "float32",
    memory: Annotated[str, typer.Option(help="memory representation: hidden (layer-L input states, float32; K/V "
                                             "projected at query time: the same answers as kv in half the bytes) | "
                                             "hidden-fp16 | hidden-int8 (lossy) | kv (stored float32 K/V) | "
                                             "recompute (nothing stored; layers 0..L rerun)")] = "hidden",
    id_field: Annotated[str, typer.Option(help="record field/column holding the id (missing: ids are filled in "
                                                "as <file>-<row>)")] = "id",
    text_field: Annotated[str | None, typer.Option(
        help="record field/column holding the text [default: text; where it is missing and one other column "
             "holds text, that one]")] = None,
    label_field: Annotated[str, typer.Option(help="record field/column holding the label")] = "label",
    lexical: Annotated[bool, typer.Option(help="write the BM25 index too (hybrid and lexical retrieval)")] = True,
    shards: Annotated[int, typer.Option(help="split the bundle into N shards (contiguous row ranges; "
                                              "`softknn serve --ray` serves one actor per shard)")] = 1,
    force: Annotated[bool, typer.Option(help="replace an existing bundle")] = False,
    cache: Annotated[Path | None, typer.Option(help="an encode cache folder: the model runs only over chunks whose "
                                                    "text it does not hold, and keeps them there for the next build "
                                                    "(a KB update re-encodes its new and changed chunks only)")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    ray: Annotated[bool, typer.Option("--ray", help="encode with Ray Data on a Ray cluster's workers "
                                                    "(the same bundle, byte for byte; docs/scale.md)")] = False,
    address: Annotated[str | None, typer.Option(help="with --ray: the cluster to join (HOST:PORT, auto, "
                                                        "ray://HOST:10001); default: start a local one")] = None,
    ray_workers: Annotated[int | None, typer.Option(help="with --ray: encoder actors (default: one per CPU "
                                                            "of the cluster)")] = None,
    generator: Annotated[str | None, typer.Option(help="also store a causal LM's keys/values of every chunk, "
                                                          "for `softknn generate` and /v1/generate: "
                                                          "smollm2-135m-instruct (packaged), a model folder or a .gguf file")] = None,
    generator_layers: Annotated[str, typer.Option(help="with --generator: its memory layers, all or a,b,c (0-based)")] = "all",
    generator_memory: Annotated[str, typer.Option(help="with --generator: fp32 | fp16 | int8 | q4 | q2 | recompute "
                                                       "(nothing stored)")] = "q4",
    generator_keep: Annotated[float, typer.Option(help="with --generator: the fraction of each chunk's tokens "
                                                       "stored, those its own attention keeps (1 = all)")] = 1.0,
) -> None:
    """Build a bundle: chunk the KB, encode it once (embeddings + the layer-L memory), index it (FAISS and BM25)."""
    from softknn.common.location import is_remote
    from softknn.index_builder.reader import Fields, read_kb, resolve_fields

    remote = out if is_remote(out) else None
    try:  # the checks that need no model come first
        if remote is not None:
            from softknn.storage.remote import holds_bundle

            if holds_bundle(remote) and not force:
                raise SoftKNNError(f"{remote}: already holds a bundle; pass --force to replace it (a deployment "
                                   "serving it refuses the new files: push each version to a new prefix)")
        elif Path(out).exists() and not force:
            raise SoftKNNError(f"{out}: already exists; pass --force to replace it")
        if cache is not None:
            _check_cache_dir(cache)
    except SoftKNNError as e:
        _fail(e)
    try:
        fields, notes = resolve_fields(kb, Fields(id=id_field, text=text_field or "text", label=label_field),
                                       text_given=text_field is not None)
        read_kb(kb, fields)  # every record parsed (bad JSON, duplicate ids) before the model loads
        from softknn.storage.memory_stores import check_kind, check_kv_dtype

        check_kind(memory)  # a typo fails before the model loads
        check_kv_dtype(memory, kv_dtype)
        if generator is not None:
            from softknn.generate.model import resolve_generator
            from softknn.storage.layout import generator_files

            generator_files(generator_memory)
            resolve_generator(generator)
            if shards > 1:
                raise ValueError("--generator needs --shards 1: generator memory is not sharded")
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    for n in notes:
        _note(n)
    from softknn.index_builder.pipeline import BuildConfig, build_bundle

    if (address is not None or ray_workers is not None) and not ray:
        _fail(ValueError("--address and --ray-workers need --ray"))
    try:
        encode = None
        if ray:
            from softknn.common.console import need_ray

            need_ray()
            from softknn.index_builder.distributed import RayEncode

            encode = RayEncode(address, workers=ray_workers, progress=progress)
        settings = _settings(model__name=model)
        cfg = BuildConfig(layer=layer, index_type=index, chunk_tokens=chunk_tokens, overlap=overlap,
                          batch_size=batch_size, kv_dtype=kv_dtype, memory=memory, lexical=lexical, shards=shards,
                          fields=fields, generator_layers=generator_layers, generator_memory=generator_memory,
                          generator_keep=generator_keep)
        gen = None
        if generator is not None:
            from softknn.generate.model import Generator

            gen = Generator.load(generator)
        enc = _encoder(_build_runtime(settings))
        stats: dict = {}
        if remote is None:
            manifest = build_bundle(kb, Path(out), cfg, enc, force=force, progress=progress, encode=encode,
                                    generator=gen, cache=cache, stats=stats)
        else:
            manifest = _build_and_push(kb, remote, cfg, enc, progress=progress, encode=encode, generator=gen,
                                       cache=cache, stats=stats)
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    c = manifest["counts"]
    sharded = f", {len(manifest['shards'])} shards" if manifest.get("shards") else ""
    typer.echo(f"built {out}: version {manifest['version_id']}, {c['chunks']} chunks{sharded}, {c['tokens']} memory tokens, "
               f"index {manifest['index']['kind']} ({manifest['index']['reason']}), memory {manifest['memory']}")
    g = manifest.get("generator")
    if g:
        kept = f", {g['keep']:g} of each chunk's tokens kept" if g.get("keep", 1.0) < 1.0 else ""
        typer.echo(f"generator {g['name']}: {len(g['layers'])} memory layers, {g['memory']}{kept}, {g['tokens']} tokens, "
                   f"{g['bytes_per_token']:,.0f} bytes per token ({g['bytes_per_chunk']:,.0f} per chunk)")
        r = (g.get("calibration") or {}).get("refusal") or {}
        if r.get("threshold") is not None:
            typer.echo(f"refusal: a question whose nearest chunk's similarity is below {r['threshold']:.3f} "
                       f"({r['quantile']:g} of {r['questions']} held-out sentences) gets the refusal text")
    if cache is not None:
        damaged = stats.get("cache_batches_damaged", 0)
        n = stats["encoded"]
        typer.echo(f"encode cache {cache}: {n} chunk{'' if n == 1 else 's'} encoded, {stats['reused']} reused"
                   + (f", {damaged} damaged batches removed and encoded again" if damaged else ""))
    _report_loo(manifest.get("calibration") or {})
    if encode is not None and encode.workers_used:
        typer.echo(f"encoded with Ray Data: {encode.workers_used} workers on {len(encode.nodes)} node(s)")


def _check_cache_dir(cache: Path) -> None:
    """--cache names a folder this process can write (made if missing), before the model loads."""
    if cache.exists() and not cache.is_dir():
        raise SoftKNNError(f"--cache {cache}: not a folder (the encode cache is a folder of encoded batches)")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SoftKNNError(f"--cache {cache}: cannot use it as the encode cache folder: {e.strerror or e}") from e
    if not os.access(cache, os.W_OK | os.X_OK):
        raise SoftKNNError(f"--cache {cache}: the encode cache folder is not writable")


def _build_and_push(kb: Path, uri: str, cfg, encoder, **kw) -> dict:
    """Build into a staging folder beside the node-local cache, push it to `uri`, remove the folder.
    The push writes the manifests last, so a reader never finds a manifest without its files."""
    import shutil

    from softknn.index_builder.pipeline import build_bundle
    from softknn.storage.remote import push, staging_dir

    staging = staging_dir()
    try:
        manifest = build_bundle(kb, staging / "bundle", cfg, encoder, **kw)
        push(staging / "bundle", uri)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _report_loo(cal: dict) -> None:
    """Say how many labelled chunks the build's abstain thresholds come from, and warn below the
    number at which the loss budget could pay for one refused right answer."""
    pq = cal.get("pseudo_queries")
    if pq:
        lam = (cal.get("retrieval_defaults") or {}).get("hybrid", {}).get("lexical_weight")
        typer.echo(f"hybrid lexical_weight {lam}: chosen from {pq['n']} pseudo-queries (held-out sentences of the "
                   f"KB's chunks; {pq['rule']})" if lam is not None else f"hybrid lexical_weight: {pq['note']}")
    loo = cal.get("leave_one_out")
    if not loo:
        return
    n, need = loo["n"], math.ceil(1 / (cal["budget_margin"] * cal["target_loss"]) - 1e-9)
    typer.echo(f"abstain thresholds: leave-one-out over {n} labelled chunks (score ≥ {cal['abstain_threshold']:.3f}, "
               f"nearest similarity ≥ {cal['min_similarity']:.3f})")
    if n < need:
        typer.secho(f"warning: only {n} labelled chunks (< {need}): each threshold sits at the lowest score of a "
                    f"right answer, so about 1 in {n + 1} in-scope queries may be refused; the reason is in "
                    "abstain_reason, and a request's abstain_threshold overrides it", fg=typer.colors.YELLOW, err=True)


@app.command("add-lexical", cls=Command)
def add_lexical(bundle: Annotated[Path, typer.Argument(help="bundle directory built without a lexical index")],
                model: ModelOpt = None) -> None:
    """Add the BM25 index to an older bundle (no re-encoding); it then serves hybrid retrieval, with
    its λ chosen as a build chooses it (an unlabelled KB's from pseudo-queries, with the bundle's model)."""
    need_bundle(bundle)
    from softknn.index_builder.pipeline import add_lexical as add
    from softknn.storage.layout import read_manifest

    try:
        m0 = read_manifest(bundle)  # the model loads only where pseudo-queries will need it
        encoder = None if m0.get("labels") or m0.get("lexical") else _encoder(_build_runtime(_settings(model__name=model)))
        m = add(bundle, encoder)
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    lam = (m.get("calibration", {}).get("retrieval_defaults", {}).get("hybrid") or {}).get("lexical_weight")
    how = f"hybrid λ {lam} ({m['calibration'].get('source')})" if lam is not None else "hybrid λ: the fixed default"
    typer.echo(f"{bundle}: lexical index added ({m['lexical']['vocabulary']} terms), {how}, version {m['version_id']}")


@app.command(cls=Command)
def verify(bundle: Annotated[Path, typer.Argument(help="bundle directory")]) -> None:
    """Check a bundle's manifest and every file's sha256."""
    need_bundle(bundle)
    from softknn.storage.layout import verify_bundle
    from softknn.storage.writes import verify_log

    try:
        m = verify_bundle(bundle)
        wal = verify_log(bundle)
    except SoftKNNError as e:
        _fail(e)
    sharded = f" in {len(m['shards'])} shards" if m.get("shards") else ""
    typer.echo(f"ok: {bundle} version {m['version_id']}, {len(m['files'])} files verified{sharded}, memory {m.get('memory', 'kv')}")
    if wal["records"] or wal["torn_bytes"]:
        torn = f"; a torn tail of {wal['torn_bytes']} bytes (a write never acknowledged) is dropped on open" \
            if wal["torn_bytes"] else ""
        typer.echo(f"write log: {wal['records']} records checksummed (writes {wal['first_seq']}..{wal['last_seq']}){torn}")


@app.command(cls=Command)
def push(bundle: Annotated[Path, typer.Argument(help="bundle directory")],
         uri: Annotated[str, typer.Argument(help="where to put it: s3://bucket/kb, gs://…, any fsspec URI")]) -> None:
    """Upload a verified bundle to object storage, its manifests last, for `serve --bundle URI`."""
    need_bundle(bundle)
    from softknn.storage.remote import is_remote
    from softknn.storage.remote import push as push_bundle
    from softknn.storage.writes import has_pending_writes

    if not is_remote(uri):
        _fail(SoftKNNError(f"{uri}: not a URI (s3://bucket/kb, gs://bucket/kb, file:///dir)"))
    if has_pending_writes(bundle):
        _fail(SoftKNNError(f"{bundle}: holds writes not yet compacted into it; run `softknn compact {bundle}` first"))
    try:
        n = push_bundle(bundle, uri)
    except SoftKNNError as e:
        _fail(e)
    typer.echo(f"ok: {bundle} → {uri}, {n} files")


@app.command(cls=Command)
def fetch(uri: Annotated[str, typer.Argument(help="a bundle in object storage: s3://bucket/kb, …")],
          shards: Annotated[bool, typer.Option("--shards", help="every shard's files too (for one node "
                                                                 "serving all of a sharded bundle)")] = False) -> None:
    """Download what serving a bundle opens into the node-local cache (SOFTKNN_CACHE_DIR); print its path."""
    from softknn.storage.layout import read_manifest
    from softknn.storage.remote import fetch as fetch_shard
    from softknn.storage.remote import is_remote, localize

    if not is_remote(uri):
        _fail(SoftKNNError(f"{uri}: not a URI (s3://bucket/kb, gs://bucket/kb, file:///dir)"))
    try:
        local = localize(uri)
        if shards:
            for sh in read_manifest(local).get("shards") or []:
                fetch_shard(f"{uri.rstrip('/')}/{sh['dir']}")
    except SoftKNNError as e:
        _fail(e)
    typer.echo(str(local))


def _store(bundle: Path):
    from softknn.index_builder.documents import BuilderDocuments
    from softknn.storage.writes import KBStore

    need_bundle(bundle)
    return KBStore(bundle, _encoder(_settings()), documents=BuilderDocuments())


@app.command(cls=Command)
def add(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    kb: Annotated[Path, typer.Argument(help="documents to add or replace: a .jsonl/.json/.csv file or a folder, "
                                            "read as `softknn build` reads a KB")],
) -> None:
    """Add or replace documents of a bundle without a rebuild (each write logged and fsynced; same code as PUT /v1/documents)."""
    from softknn.index_builder.documents import kb_documents
    from softknn.index_builder.reader import Fields, resolve_fields

    try:
        fields, notes = resolve_fields(kb, Fields())
        for n in notes:
            _note(n)
        docs = kb_documents(kb, fields)
        store = _store(bundle)
        try:
            for d in docs:
                r = store.put(d.doc_id, {"text": d.text, "label": d.label, "metadata": d.metadata})
                typer.echo(f"ok: put {d.doc_id} ({r.chunks} chunks{', new' if r.created else ''}), write {r.seq}")
        finally:
            store.close()
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    typer.echo(f"{bundle}: version {store.bundle.version}, {len(store.bundle)} chunks; "
               f"{store.pending_writes} writes logged since the base (`softknn compact` folds them in)")


@app.command(cls=Command)
def remove(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    doc_id: Annotated[list[str], typer.Argument(help="document id(s) to delete")],
) -> None:
    """Delete documents from a bundle without a rebuild (same code as DELETE /v1/documents)."""
    try:
        store = _store(bundle)
        try:
            for d in doc_id:
                r = store.delete(d)
                typer.echo(f"ok: deleted {d}, write {r.seq}")
        finally:
            store.close()
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    typer.echo(f"{bundle}: version {store.bundle.version}, {len(store.bundle)} chunks")


@app.command(cls=Command)
def compact(bundle: Annotated[Path, typer.Argument(help="bundle directory")]) -> None:
    """Fold a bundle's logged writes into a new base bundle (atomic swap; a labelled KB is recalibrated)."""
    try:
        store = _store(bundle)
        try:
            r = store.compact()
        finally:
            store.close()
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    cal = ", labelled KB recalibrated" if r["recalibrated"] else ""
    typer.echo(f"{bundle}: {r['writes_folded']} writes folded, version {store.bundle.version}{cal}")


@app.command(cls=Command)
def info(bundle: Annotated[Path, typer.Argument(help="bundle directory")]) -> None:
    """Print a bundle's manifest as JSON, with `memory_summary` (its memory's kind and bytes per chunk); no checksum pass (see `verify`)."""
    need_bundle(bundle)
    from softknn.storage.layout import MANIFEST, read_manifest
    from softknn.storage.manifest import Manifest
    from softknn.storage.memory_stores import memory_summary

    try:
        m = read_manifest(bundle)
        m = {**m, "memory": m.get("memory", "kv"), "memory_summary": memory_summary(Manifest.of(m, bundle / MANIFEST))}
    except SoftKNNError as e:
        _fail(e)
    typer.echo(json.dumps(m, indent=2, sort_keys=True))


@app.command(cls=Command)
@table_options(InferParams)
def query(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    texts: Annotated[list[str], typer.Argument(help="input texts")],
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result objects as JSON")] = False,
    given: dict | None = None,
) -> None:
    """Run knowledge-augmented inference on TEXTS against BUNDLE; prints one result per input (what
    POST /v1/infer answers for the same parameters, unset ones filled the same way)."""
    need_bundle(bundle)
    from softknn.infer.engine import Engine
    from softknn.model.encoder import TRUNCATE_HINT
    from softknn.storage.bundle import load_bundle

    try:
        settings = _settings(model__name=model)
        params = infer_params(settings, given or {})
        encoder = _encoder(settings)
        b = load_bundle(bundle, expected_fingerprint=encoder.info.fingerprint, use_gpu=settings.use_gpu_index)
        results = Engine(encoder, b).infer(list(texts), params)
    except InputTooLarge as e:  # the encoder names the HTTP field; here the flag is what to pass
        _fail(e.message.replace(TRUNCATE_HINT, "pass --truncate to cut it"))
    except SoftKNNError as e:
        _fail(e)
    meta = {"bundle_version": b.version, "model": encoder.info.name, "model_fingerprint": encoder.info.fingerprint}
    if as_json:
        typer.echo(json.dumps({**meta, "results": [r.to_dict() for r in results]}, ensure_ascii=False))
        return
    for text, r in zip(texts, results, strict=True):
        typer.secho(f"\n> {text}", bold=True)
        dg = r.diagnostics
        mix = f" λ={dg.lexical_weight}" if dg.retrieval == "hybrid" else ""
        pred = "— abstained" if r.abstained else repr(r.prediction)
        typer.echo(f"  retrieval {dg.retrieval}{mix}  memory share {dg.memory_share:.3f}  "
                   f"w_db eff-k {dg.w_db_effective_k:.2f}  prediction {pred}")
        if r.abstained:
            typer.echo(f"  abstained (no prediction): {r.abstain_reason}")
        for ev in r.evidence:
            _evidence_lines(ev, 90)


def _evidence_lines(ev, width: int) -> None:
    """One evidence item as `softknn query` and `softknn generate` print it (softknn.infer.results.EvidenceItem)."""
    spans = ", ".join(repr(s.text) for s in ev.spans[:3])
    bm25 = "" if ev.bm25 is None else f" bm25 {ev.bm25:.2f}"
    words = f" matched {', '.join(ev.matched_terms)}" if ev.matched_terms else ""
    typer.echo(f"  [{ev.mass_share:.3f}] {ev.chunk_id} ({ev.label}): {ev.text[:width]!r}  ← {spans}")
    typer.echo(f"          s {ev.similarity:.3f}  dense {ev.dense_similarity:.3f}{bm25}{words}")


@app.command(cls=Command)
@table_options(GenParams)
def generate(
    bundle: Annotated[Path, typer.Argument(help="bundle directory built with --generator")],
    question: Annotated[str, typer.Argument(help="the question (a user message through the chat template)")],
    raw: Annotated[bool, typer.Option(help="send QUESTION as a raw prompt, no chat template")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer object as JSON")] = False,
    given: dict | None = None,
) -> None:
    """Answer QUESTION with the generator attending to the KB chunks retrieved for it; prints the answer and its
    evidence (what POST /v1/generate answers for the same parameters, unset ones filled the same way)."""
    need_bundle(bundle)
    from softknn.generate.serving import gen_engine_for
    from softknn.retrieval.search import Retriever
    from softknn.storage.bundle import load_bundle

    try:
        settings = _settings()
        params = gen_params(settings, given or {})
        encoder = _encoder(settings)
        b = load_bundle(bundle, expected_fingerprint=encoder.info.fingerprint, use_gpu=settings.use_gpu_index)
        ge = gen_engine_for(settings, Retriever(b), encoder)
        ans = ge.answer(params, prompt=question if raw else None,
                        messages=None if raw else [{"role": "user", "content": question}])
    except SoftKNNError as e:
        _fail(e)
    if as_json:
        meta = {"model": encoder.info.name, "model_fingerprint": encoder.info.fingerprint}
        typer.echo(json.dumps({**meta, **ans.to_dict()}, ensure_ascii=False))
        return
    d = ans.diagnostics
    typer.secho(f"> {question}", bold=True)
    typer.echo(ans.text.strip())
    typer.echo(f"  [{ans.finish_reason}, {ans.usage['completion_tokens']} tokens; memory {d['memory_source']}, "
               f"{d['mixing'] or 'no KB'}, memory share {d['memory_share']:.3f}]")
    g = d.get("grounding") or {}
    typer.echo(f"  [grounded {'unknown' if ans.grounded is None else str(ans.grounded).lower()}: {g.get('note', '')}]")
    for ev in ans.evidence:
        _evidence_lines(ev, 80)


@app.command(cls=Command)
def sample_kb() -> None:
    """Print the path of the bundled sample KB."""
    typer.echo(str(sample_kb_path()))


def _register_edge_commands() -> None:
    """Commands whose code lives in the apps (softknn/service/, softknn/evaluation/), registered without importing
    FastAPI or matplotlib (softknn/service/__init__.py loads the app lazily; tests/test_layering.py)."""
    from softknn.evaluation.cli import calibrate_command, eval_command
    from softknn.service.cli import serve

    app.command("serve", cls=Command)(serve)
    app.command("eval", cls=Command)(eval_command)
    app.command("calibrate", cls=Command)(calibrate_command)


_register_edge_commands()


def main() -> None:  # pragma: no cover
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app()
