"""The `softknn` command: parses, builds Settings, calls the packages. No logic of its own."""

from __future__ import annotations

import json
import logging
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer

from softknn.errors import SoftKNNError

app = typer.Typer(
    help="softknn: attention over a FAISS-indexed knowledge base, with evidence.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def sample_kb_path() -> Path:
    """The bundled sample KB (an original fictional ferry-cooperative text)."""
    return Path(str(resources.files("softknn") / "sample_kb" / "kb"))


def _settings(**overrides):
    from softknn.settings import Settings, apply_threads

    s = Settings()
    for key, value in overrides.items():
        if value is not None:
            section, _, name = key.partition("__")
            if name:
                setattr(getattr(s, section), name, value)
            else:
                setattr(s, section, value)
    apply_threads(s)
    return s


def _encoder(settings):
    from softknn.encoder import Encoder

    return Encoder(settings.model.name, device=settings.device())


def _fail(e: Exception) -> None:
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


ModelOpt = Annotated[Optional[str], typer.Option("--model", help="sentence-transformers model path (default: packaged all-MiniLM-L6-v2)")]


@app.command()
def build(
    kb: Annotated[Path, typer.Argument(help="KB: a .jsonl/.json/.csv file, or a folder of them and .txt/.md files")],
    out: Annotated[Path, typer.Option("--out", "-o", help="bundle directory to write")],
    model: ModelOpt = None,
    layer: Annotated[int, typer.Option(help="memory layer, 0-based; -1 = last")] = -1,
    index: Annotated[str, typer.Option(help="auto | flat | hnsw | ivf | ivfpq")] = "auto",
    chunk_tokens: Annotated[Optional[int], typer.Option(help="tokens per chunk (default max_seq_length − 8)")] = None,
    overlap: Annotated[int, typer.Option(help="tokens shared by consecutive chunks")] = 32,
    batch_size: Annotated[int, typer.Option(help="chunks per model pass")] = 32,
    kv_dtype: Annotated[str, typer.Option(help="float32 | float16 for stored keys/values")] = "float32",
    memory: Annotated[str, typer.Option(help="memory representation: kv (stored K/V) | hidden | hidden-fp16 | "
                                             "hidden-int8 (layer-L input states; K/V projected at query time) | "
                                             "recompute (nothing stored; layers 0..L rerun)")] = "kv",
    id_field: Annotated[str, typer.Option(help="record field/column holding the id")] = "id",
    text_field: Annotated[str, typer.Option(help="record field/column holding the text")] = "text",
    label_field: Annotated[str, typer.Option(help="record field/column holding the label")] = "label",
    lexical: Annotated[bool, typer.Option(help="write the BM25 index too (hybrid and lexical retrieval)")] = True,
    force: Annotated[bool, typer.Option(help="replace an existing bundle")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Build a bundle: chunk the KB, encode it once (embeddings + layer-L keys/values), index it (FAISS and BM25)."""
    from index_builder.pipeline import BuildConfig, build_bundle
    from index_builder.reader import Fields

    from softknn.memory_repr import check_kind

    try:
        check_kind(memory)  # before the model loads: a typo fails at once
        settings = _settings(model__name=model)
        cfg = BuildConfig(layer=layer, index_type=index, chunk_tokens=chunk_tokens, overlap=overlap,
                          batch_size=batch_size, kv_dtype=kv_dtype, memory=memory, lexical=lexical,
                          fields=Fields(id=id_field, text=text_field, label=label_field))
        manifest = build_bundle(kb, out, cfg, _encoder(settings), force=force, progress=progress)
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    c = manifest["counts"]
    typer.echo(f"built {out}: version {manifest['version_id']}, {c['chunks']} chunks, {c['tokens']} memory tokens, "
               f"index {manifest['index']['kind']} ({manifest['index']['reason']}), memory {manifest['memory']}")


@app.command("add-lexical")
def add_lexical(bundle: Annotated[Path, typer.Argument(help="bundle directory built without a lexical index")]) -> None:
    """Add the BM25 index to an older bundle (no re-encoding); it then serves hybrid retrieval."""
    from index_builder.pipeline import add_lexical as add

    try:
        m = add(bundle)
    except (SoftKNNError, ValueError) as e:
        _fail(e)
    typer.echo(f"{bundle}: lexical index added ({m['lexical']['vocabulary']} terms), version {m['version_id']}")


@app.command()
def verify(bundle: Annotated[Path, typer.Argument(help="bundle directory")]) -> None:
    """Check a bundle's manifest and every file's sha256."""
    from softknn.bundle import verify_bundle

    try:
        m = verify_bundle(bundle)
    except SoftKNNError as e:
        _fail(e)
    typer.echo(f"ok: {bundle} version {m['version_id']}, {len(m['files'])} files verified, memory {m.get('memory', 'kv')}")


@app.command()
def info(bundle: Annotated[Path, typer.Argument(help="bundle directory")]) -> None:
    """Print a bundle's manifest as JSON, with `memory_summary` (its memory's kind and bytes per chunk); no checksum pass (see `verify`)."""
    from softknn.bundle import read_manifest
    from softknn.memory_repr import memory_summary

    try:
        m = read_manifest(bundle)
        m = {**m, "memory": m.get("memory", "kv"), "memory_summary": memory_summary(m)}
    except SoftKNNError as e:
        _fail(e)
    typer.echo(json.dumps(m, indent=2, sort_keys=True))


@app.command()
def query(
    bundle: Annotated[Path, typer.Argument(help="bundle directory")],
    texts: Annotated[list[str], typer.Argument(help="input texts")],
    model: ModelOpt = None,
    alpha: Annotated[Optional[float], typer.Option(help="fixed-mixing weight of the input's own attention")] = None,
    mixing: Annotated[Optional[str], typer.Option(help="fixed | joint")] = None,
    k: Annotated[Optional[int], typer.Option(help="chunks retrieved")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="k-NN temperature τ")] = None,
    kernel: Annotated[Optional[str], typer.Option(help="softmax | epanechnikov | uniform")] = None,
    exact: Annotated[bool, typer.Option(help="exact search (bypass the ANN index)")] = False,
    threshold: Annotated[Optional[float], typer.Option(help="top-k + threshold: also keep pool chunks with w ≥ threshold")] = None,
    retrieval: Annotated[Optional[str], typer.Option(help="hybrid | dense | lexical (default: hybrid where the "
                                                          "bundle has a lexical index, else dense)")] = None,
    lexical_weight: Annotated[Optional[float], typer.Option(help="λ of the hybrid similarity (1−λ)·dense + λ·BM25")] = None,
    evidence: Annotated[Optional[int], typer.Option(help="evidence items per input")] = None,
    tokens: Annotated[bool, typer.Option(help="also return per-token outputs")] = False,
    truncate: Annotated[bool, typer.Option(help="cut inputs longer than the model's limit")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result objects as JSON")] = False,
) -> None:
    """Run knowledge-augmented inference on TEXTS against BUNDLE; prints one result per input."""
    from softknn.bundle import load_bundle
    from softknn.engine import Engine, InferParams

    try:
        settings = _settings(model__name=model)
        d = settings.defaults
        params = InferParams(
            alpha=d.alpha if alpha is None else alpha, mixing=mixing or d.mixing, k=k or d.k,
            temperature=temperature or d.temperature, kernel=kernel or d.kernel, exact=exact,
            threshold=threshold, hybrid_pool=d.hybrid_pool, evidence=d.evidence if evidence is None else evidence,
            spans=d.spans, return_tokens=tokens, truncate=truncate, retrieval=retrieval or d.retrieval,
            lexical_weight=d.lexical_weight if lexical_weight is None else lexical_weight, candidates=d.candidates,
        ).validate()
        encoder = _encoder(settings)
        b = load_bundle(bundle, expected_fingerprint=encoder.info.fingerprint, use_gpu=settings.use_gpu_index)
        results = Engine(encoder, b).infer(list(texts), params)
    except SoftKNNError as e:
        _fail(e)
    meta = {"bundle_version": b.version, "model": encoder.info.name, "model_fingerprint": encoder.info.fingerprint}
    if as_json:
        typer.echo(json.dumps({**meta, "results": results}, ensure_ascii=False))
        return
    for text, r in zip(texts, results, strict=True):
        typer.secho(f"\n> {text}", bold=True)
        dg = r["diagnostics"]
        mix = f" λ={dg['lexical_weight']}" if dg["retrieval"] == "hybrid" else ""
        typer.echo(f"  retrieval {dg['retrieval']}{mix}  memory share {dg['memory_share']:.3f}  "
                   f"w_db eff-k {dg['w_db_effective_k']:.2f}  prediction {r['prediction']!r}")
        if r.get("abstained"):
            typer.echo(f"  abstained: {r['abstain_reason']}")
        for ev in r["evidence"]:
            spans = ", ".join(repr(s["text"]) for s in ev["spans"][:3])
            bm25 = "" if ev["bm25"] is None else f" bm25 {ev['bm25']:.2f}"
            words = f" matched {', '.join(ev['matched_terms'])}" if ev.get("matched_terms") else ""
            typer.echo(f"  [{ev['mass_share']:.3f}] {ev['chunk_id']} ({ev['label']}): {ev['text'][:90]!r}  ← {spans}")
            typer.echo(f"          s {ev['similarity']:.3f}  dense {ev['dense_similarity']:.3f}{bm25}{words}")


@app.command()
def sample_kb() -> None:
    """Print the path of the bundled sample KB."""
    typer.echo(str(sample_kb_path()))


def _register_edge_commands() -> None:
    """Commands whose code lives at the edges (the service), registered without importing FastAPI."""
    from service.cli import serve
    from softknn.eval_cli import calibrate_command, eval_command

    app.command("serve")(serve)
    app.command("eval")(eval_command)
    app.command("calibrate")(calibrate_command)


_register_edge_commands()


def main() -> None:  # pragma: no cover
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app()
