"""Several chunks at the prompt's quality: how much of the chunks' attention to each other a request must
restore (CacheBlend's selective recompute), measured in torch on the unmodified model before any of it
is built into the decode graph.

Every mode is the model on the same tokens [prefix ; chunk_1 … chunk_k ; question] with reordered
positions (the chunks one after another, as in the prompt), under a mask that says which tokens see
which:
- `prompt`: every token sees every earlier one: prompt-stuffed RAG (recompute share 1);
- `memory`: a chunk token sees the prefix and its own chunk only (each chunk encoded apart, as the
  store holds it: the masked-concatenation contract of joint memory);
- `blend@r`: as `memory`, except the share r of the chunk tokens whose keys/values deviate most from
  the prompt's at layer 1 (CacheBlend's selection: ‖ΔK‖² + ‖ΔV‖² over heads) see everything before
  them, as in the prompt — the recompute CacheBlend runs per request, here as a mask.
The question and the answer see everything, with the k-NN prior β·log(k·w_db(c)) added to their scores
on chunk c's tokens for each β of --priors (the memory's prior; `_bβ` in the mode's name). Greedy,
MAX_TOKENS tokens, scored as gen_quality scores.

    python -m bench gen_blend [--kb obliqa|sample] [--ks 4] [--shares 0.1,0.2,0.4] [--priors 0,4] [--limit 40]
        [--split validation]

→ bench/results/gen_blend_<kb>.json (or --name).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.common import write

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 24


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kb", default="obliqa", choices=["obliqa", "sample"])
    ap.add_argument("--ks", default="4")
    ap.add_argument("--shares", default="0.1,0.2,0.4")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--priors", default="0", help="β of the k-NN prior on the question's and answer's rows")
    ap.add_argument("--norm-prior", action="store_true", help="the prior's factors over their mean (mass moves "
                    "between chunks, not from the prompt's own tokens)")
    ap.add_argument("--temps", default="", help="also the memory path itself (torch, joint) with the memory keys "
                    "scaled by 1/T for each T (APE's attention temperature), at each β")
    ap.add_argument("--passages", type=int, default=1000, help="ObliQA KB size (gen_quality's obliqa_qa_kb)")
    ap.add_argument("--name", default="", help="result file name (default gen_blend_KB)")


def _layer_kv(gen, ids: list[int], pos: list[int], allowed, layer: int):
    """(K, V) (nkv, N, hs) at `layer` of the model on ids under the bool mask allowed (N, N)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=gen.model.config)
    with torch.inference_mode():
        gen.model.model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]), attention_mask=allowed[None, None],
                        **{gen.cache_kw: cache}, use_cache=True)
    lay = cache.layers[layer]
    return lay.keys[0], lay.values[0]


def _masks(P: int, lengths: list[int], rest: int):
    """(memory mask, prompt mask) (N, N) bool over [prefix P ; chunks ; rest]."""
    import torch

    N, M = P + sum(lengths) + rest, P + sum(lengths)
    full = torch.ones(N, N, dtype=torch.bool).tril()
    mem = torch.zeros(N, N, dtype=torch.bool)
    mem[:P, :P] = full[:P, :P]
    o = P
    for n in lengths:
        mem[o : o + n, :P] = True
        mem[o : o + n, o : o + n] = full[:n, :n]
        o += n
    mem[M:] = full[M:]
    return mem, full


def _generate(gen, ids: list[int], pos: list[int], allowed, max_tokens: int, prior=None, ctx: int = 0) -> str:
    """Greedy answer under the bool mask `allowed`; `prior` (N,) float: added to the scores of the
    question's and the answer's rows (rows ≥ ctx) on each column (the k-NN prior on the chunks' columns)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=gen.model.config)
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    if prior is not None:
        mask[ctx:] += prior[None, :]
    x, p, mask = torch.tensor([ids]), torch.tensor([pos]), mask[None, None]
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = gen.model(input_ids=x, position_ids=p, attention_mask=mask, **{gen.cache_kw: cache},
                               use_cache=True, logits_to_keep=1).logits[0, -1]
            tok = int(logits.argmax())
            if tok in gen.eos_ids:
                break
            out.append(tok)
            x, p = torch.tensor([[tok]]), p[:, -1:] + 1
            row = torch.zeros(cache.get_seq_length() + 1)
            if prior is not None:
                row[: prior.shape[0]] += prior
            mask = row[None, None, None]
    return gen.tokenizer.decode(out, skip_special_tokens=True)


def _question(gen, engine, q: dict, k: int, shares: list[float], priors: list[float], temps: list[float],
              norm: bool = False) -> dict:
    import numpy as np
    import torch

    from bench.gen_quality import _correct
    from bench.generation import msgs
    from softknn.infer.engine import InferParams

    ip = engine.resolve([InferParams(k=k, evidence=0)])[0]
    enc = engine.encoder
    emb = enc.forward_plain(enc.tokenize([q["question"]], truncate=[True])).embedding.float().cpu().numpy()
    retr = engine.retrieve(emb, [ip], [q["question"]])
    rows = retr.rows[0]
    chunk_ids = [gen.memory_ids(engine.bundle.chunks[r]["text"]) for r in rows]
    prefix, rest = gen.layout(messages=msgs(q["question"]))
    P, lengths = len(prefix), [len(c) for c in chunk_ids]
    ids = prefix + [t for c in chunk_ids for t in c] + rest
    pos = list(range(len(ids)))  # reordered: the chunks one after another, the question after them
    mem, full = _masks(P, lengths, len(rest))
    ctx = P + sum(lengths)
    kf, vf = _layer_kv(gen, ids[:ctx], pos[:ctx], full[:ctx, :ctx], 1)
    km, vm = _layer_kv(gen, ids[:ctx], pos[:ctx], mem[:ctx, :ctx], 1)
    dev = ((kf - km) ** 2).sum((0, 2)) + ((vf - vm) ** 2).sum((0, 2))  # (ctx,)
    dev = dev[P:ctx].numpy()  # the chunk tokens'
    order = np.argsort(-dev, kind="stable")
    out = {"id": q["id"], "R": [engine.bundle.chunks[r]["chunk_id"] for r in rows], "memory_tokens": int(sum(lengths))}
    modes = {"prompt": full} if temps else {"prompt": full, "memory": mem}  # with temps: the memory path is memhook
    for r in shares:
        if r <= 0:
            continue
        sel = order[: int(round(r * len(order)))] + P
        m = mem.clone()
        m[sel, :] = full[sel, :]  # the selected chunk tokens see every earlier token
        modes[f"blend@{r:g}"] = m
    w = np.asarray(retr.weights[0], dtype=np.float64)
    if temps:  # the production memory path (torch, joint): stored-style K/V, keys scaled by 1/T (APE's temperature)
        from softknn.generate.attention import place_memory
        from softknn.generate.model import Sampling

        layers = gen.layers("all")
        starts = [P + sum(lengths[:c]) for c in range(len(lengths))]
        kv = [torch.from_numpy(x) for x in gen.chunk_kv(chunk_ids, layers, prefix=prefix, starts=starts)]
        for T in temps:
            for beta in priors:
                mem = place_memory(kv, layers, torch.tensor(w, dtype=torch.float32), "reordered", gen.inv_freq,
                                   encoded_after=starts, prefix_len=P)
                for lm in mem.layers.values():
                    lm.key /= T
                t0 = time.perf_counter()
                g = gen.run(prefix + rest, mem, sampling=Sampling(max_tokens=MAX_TOKENS), mixing="joint", prior=beta)
                out[f"memhook_T{T:g}_b{beta:g}"] = {"answer": g.text.strip(), "correct": _correct(g.text, q),
                                                   "s": round(time.perf_counter() - t0, 2)}
    for beta in priors:
        bias = None
        if beta:  # β·log(k·w_db(c)) on chunk c's columns, as the memory's prior
            lp = beta * np.log(np.maximum(w, 1e-30) * len(lengths))
            if norm:  # the factors (k·w_db(c))^β over their mean: the prior moves mass between chunks only
                lp = lp - np.log(np.mean(np.exp(lp)))
            bias = torch.zeros(len(ids))
            o = P
            for c, n in enumerate(lengths):
                bias[o : o + n] = float(lp[c])
                o += n
        for name, allowed in modes.items():
            if beta and name == "prompt":
                continue
            t0 = time.perf_counter()
            text = _generate(gen, ids, pos, allowed, MAX_TOKENS, bias, ctx)
            key = name if not beta else f"{name}_b{beta:g}"
            out[key] = {"answer": text.strip(), "correct": _correct(text, q), "s": round(time.perf_counter() - t0, 2)}
    return out


def run(args: argparse.Namespace) -> dict:
    from bench.gen_quality import QA_OBLIQA, _summary, obliqa_qa_kb
    from bench.generation import CACHE, load_qa, models, setup_threads
    from softknn.index_builder.pipeline import BuildConfig, build_bundle
    from softknn.infer.engine import Engine
    from softknn.storage.bundle import load_bundle

    setup_threads()
    enc, gen = models()
    if args.kb == "sample":
        kb = ROOT / "softknn" / "sample_kb" / "kb"
        qs = [q for q in load_qa() if q["split"] == args.split]
    else:
        allq = [json.loads(x) for x in QA_OBLIQA.read_text().splitlines() if x.strip()]
        kb = obliqa_qa_kb(allq, args.passages)
        qs = [q for q in allq if q["split"] == args.split]
    qs = qs[: args.limit or None]
    out_dir = CACHE / f"blend-{args.kb}"
    if not (out_dir / "manifest.json").exists():
        build_bundle(kb, out_dir, BuildConfig(), enc, force=True, progress=False)  # retrieval only: no generator
    engine = Engine(enc, load_bundle(out_dir, expected_fingerprint=enc.info.fingerprint))
    shares = [float(x) for x in args.shares.split(",")]
    priors = [float(x) for x in args.priors.split(",")]
    temps = [float(x) for x in args.temps.split(",")] if args.temps else []
    t0 = time.perf_counter()
    res: dict = {}
    for k in [int(x) for x in args.ks.split(",")]:
        rows = []
        for i, q in enumerate(qs):
            rows.append(_question(gen, engine, q, k, shares, priors, temps, args.norm_prior))
            if i % 10 == 9:
                print(k, i + 1, {m: sum(r[m]["correct"] for r in rows) for m in rows[0] if isinstance(rows[0][m], dict)},
                      flush=True)
        modes = [m for m in rows[0] if isinstance(rows[0][m], dict)]
        res[str(k)] = {"summary": {m: _summary([r[m] for r in rows]) for m in modes}, "per_question": rows}
        print(k, res[str(k)]["summary"], flush=True)
    payload = {"command": getattr(args, "command", ""), "kb": args.kb, "split": args.split, "questions": len(qs),
               "max_tokens": MAX_TOKENS, "shares": shares, "priors": priors, "results": res, "wall_s": round(time.perf_counter() - t0, 1)}
    return write(args.name or f"gen_blend_{args.kb}", payload)


if __name__ == "__main__":
    from bench.__main__ import main

    main(["gen_blend", *sys.argv[1:]])
