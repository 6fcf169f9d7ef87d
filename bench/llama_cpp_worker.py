"""llama.cpp (libllama of the `llama-cpp-py-sync` wheel, through its CFFI C API) for `python -m bench
generation llama_cpp` and `gen_serving`: prompt-stuffed RAG on the same token ids softknn builds, one stream,
several prefilled in turn then decoded together (one llama_decode per step over every running sequence), or
several served as llama-server serves them (requests arriving, prompt chunks interleaved with decode steps).

Runs in its own venv (not a dependency of softknn; recipe in ../shared/PEERS.md: the wheel, the glibc
shim, LD_PRELOAD). Reads one JSON request per stdin line, writes one JSON reply per line:

    {"op": "gen", "ids": [...], "max_tokens": 16}
        one sequence, fresh cache: prompt in n_batch chunks (logits of the last token only), then one
        llama_decode + greedy sample + token_to_piece per token. Reply: prompt_tokens, tokens, token_ids,
        ttft_s (prompt → first token sampled), decode_s (first → last token), times (each token's time
        after t0).
    {"op": "parallel", "prompts": [[...], ...], "max_tokens": 16}
        N sequences at once (seq ids 0..N−1, fresh cache): each prompt prefilled in turn, then every step
        one llama_decode of one token per running sequence, greedy per sequence. Reply: per stream the
        token ids and each token's time after t0; wall_s.
    {"op": "serve", "prompts": [[...], ...], "arrivals": [0.0, ...], "max_tokens": 128, "n_batch": 512,
     "ignore_eos": false}
        (defaults: max_tokens 128, n_batch 512, ignore_eos false; arrivals required, one per prompt)
        llama-server's slot loop (tools/server `update_slots`, continuous batching) over N_SEQ slots (seq id =
        slot id, fresh cache): request r joins the queue at arrivals[r] seconds after t0 (the op's start) and
        takes the lowest free slot at the first iteration that begins at or after it (FIFO; more requests than
        slots wait). Each iteration is ONE llama_decode of one batch: first one token for every generating slot
        (slot order, logits on), then prompt tokens of the prefilling slots (slot order) until the batch holds
        n_batch tokens (1 ≤ n_batch ≤ the context's 512), so a long prompt is chunked and its chunks ride with
        the other slots' decode steps; only a prompt's last token asks for logits. After the decode each slot
        with an output samples greedily (llama.cpp's sampler), its first token once its prompt is done. A
        slot stops at an end-of-generation token (not returned: stop "eos") or after max_tokens tokens (stop
        "length") and is freed at once. ignore_eos true is llama-server's `ignore_eos`: every end-of-
        generation token's logit is −inf before the argmax, so each stream returns exactly max_tokens tokens.
        With no slot busy, the loop sleeps until the next arrival. Each prompt + max_tokens must fit one
        sequence's cells (llama_n_ctx_seq: N_CTX / N_SEQ; with KV_UNIFIED all N_CTX cells, which the running
        sequences share, so they must fit together or llama_decode fails). Greedy tokens may differ from `gen`'s
        for the same prompt: llama.cpp's CPU kernels round differently with the number of tokens in a micro-batch
        (a decode token riding with a prompt chunk, a prompt chunk split per sequence when the cache is not
        unified), which flips near-ties of the argmax. Reply:
            {"streams": [{"prompt_tokens": int, "arrival_s": float, "start_s": float, "slot": int,
                          "token_ids": [int, ...], "times": [float, ...], "stop": "eos" | "length"}, ...],
             "wall_s": float, "n_slots": int, "n_batch": int,
             "steps": [[end_s, decode_tokens, prompt_tokens], ...]}
        streams in request order; all times are seconds after t0: start_s when the request took its slot,
        times[i] when token i was sampled (empty if the first is an end of generation), so TTFT = times[0] −
        arrival_s, inter-token gaps = diff(times), aggregate tok/s = Σ len(token_ids) / max(times[-1]); steps:
        per llama_decode its end and how many of its tokens were decode steps and how many prompt tokens.
    {"op": "quit"}

Any failed request is answered {"error": "..."} and the worker reads on.

    LD_PRELOAD=…/libisoc23shim.so VENV/bin/python bench/llama_cpp_worker.py MODEL.gguf N_CTX N_SEQ THREADS [KV_UNIFIED]

N_SEQ is the context's n_seq_max (serve's slot count, llama-server's -np). KV_UNIFIED (0 or 1, default 0 as
llama-server with an explicit -np): 0 gives each sequence its own N_CTX / N_SEQ cells, so attention reads
only that sequence's cache; 1 shares all N_CTX cells (llama-server's --kv-unified).
"""

import json
import sys
import time
from dataclasses import dataclass, field

from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

lib, ffi = get_lib(), get_ffi()
N_BATCH = 512


@ffi.callback("void(enum ggml_log_level, const char *, void *)")
def _quiet(level, text, user):  # stdout is the protocol: drop llama.cpp's log lines
    return None


@dataclass
class _Request:
    """One serve request and its slot's progress: pos = cells written (prompt, then fed tokens)."""

    ids: list[int]
    arrival_s: float
    slot: int = -1
    start_s: float | None = None
    pos: int = 0
    generating: bool = False
    next_tok: int = -1
    token_ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stop: str | None = None


def _slot_batch(slots: list[_Request | None], n_batch: int) -> tuple[list[tuple[int, int, int, bool]],
                                                                      list[tuple[int, _Request]]]:
    """One update_slots batch: a token per generating slot, then prompt chunks up to n_batch tokens.

    Returns the (token, position, sequence, wants logits) items and, per item that asks for logits, its batch
    index and request. Advances each request's pos past what it put in the batch.
    """
    items: list[tuple[int, int, int, bool]] = []
    outs: list[tuple[int, _Request]] = []
    for r in slots:
        if r is not None and r.generating:
            outs.append((len(items), r))
            items.append((r.next_tok, r.pos, r.slot, True))
            r.pos += 1
    for r in slots:
        if len(items) >= n_batch:
            break
        if r is None or r.generating or r.pos == len(r.ids):
            continue
        take = min(n_batch - len(items), len(r.ids) - r.pos)
        items += [(r.ids[p], p, r.slot, False) for p in range(r.pos, r.pos + take)]
        r.pos += take
        if r.pos == len(r.ids):  # the prompt's last token: its logits give the first answer token
            items[-1] = (*items[-1][:3], True)
            outs.append((len(items) - 1, r))
    return items, outs


class Worker:
    def __init__(self, model_path: str, n_ctx: int, n_seq: int, threads: int, kv_unified: bool = False):
        lib.llama_log_set(_quiet, ffi.NULL)
        lib.llama_backend_init()
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(model_path.encode(), mp)
        assert self.model != ffi.NULL, "model load failed"
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, N_BATCH, N_BATCH
        cp.n_seq_max = n_seq
        cp.kv_unified = kv_unified
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = False
        self.ctx = lib.llama_init_from_model(self.model, cp)
        assert self.ctx != ffi.NULL, "context init failed"
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.mem = lib.llama_get_memory(self.ctx)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.batch = lib.llama_batch_init(max(N_BATCH, n_seq), 0, 1)
        self.n_seq = n_seq
        self.smpl = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        lib.llama_sampler_chain_add(self.smpl, lib.llama_sampler_init_greedy())
        self.smpl_no_eog = self._greedy_without_eog()

    def _greedy_without_eog(self):
        """Greedy after a −inf logit bias on every end-of-generation token (llama-server's ignore_eos)."""
        eog = [t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self.vocab, t)]
        self._eog_bias = ffi.new("llama_logit_bias[]", [{"token": t, "bias": float("-inf")} for t in eog])
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_logit_bias(self.n_vocab, len(eog), self._eog_bias))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        return chain

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) items."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, int(logits)
            b.seq_id[i][0] = seq
        rc = lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i: int, smpl=None) -> int:
        """The greedy token at batch output i (−1: the last), llama.cpp's own sampler."""
        return int(lib.llama_sampler_sample(self.smpl if smpl is None else smpl, self.ctx, i))

    def _prefill(self, ids: list[int], seq: int) -> int:
        for off in range(0, len(ids), N_BATCH):
            chunk = ids[off : off + N_BATCH]
            self._decode([(t, off + i, seq, off + i == len(ids) - 1) for i, t in enumerate(chunk)])
        return self._argmax(-1)

    def parallel(self, prompts: list[list[int]], max_tokens: int) -> dict:
        lib.llama_memory_clear(self.mem, True)
        t0 = time.perf_counter()
        streams = [{"token_ids": [], "times": []} for _ in prompts]
        nxt, pos, live = {}, {}, []
        for s, ids in enumerate(prompts):
            nxt[s], pos[s] = self._prefill(ids, s), len(ids)
            live.append(s)
        while live:
            now = time.perf_counter() - t0
            feed = []
            for s in list(live):
                tok = nxt[s]
                if lib.llama_vocab_is_eog(self.vocab, tok):
                    live.remove(s)
                    continue
                streams[s]["token_ids"].append(tok)
                streams[s]["times"].append(now)
                if len(streams[s]["token_ids"]) >= max_tokens:
                    live.remove(s)
                    continue
                feed.append(s)
            if not feed:
                break
            self._decode([(nxt[s], pos[s], s, True) for s in feed])
            for i, s in enumerate(feed):
                pos[s] += 1
                nxt[s] = self._argmax(i)
        return {"streams": streams, "wall_s": time.perf_counter() - t0}

    def serve(self, prompts: list[list[int]], arrivals: list[float], max_tokens: int, n_batch: int,
              ignore_eos: bool) -> dict:
        """llama-server's update_slots loop over self.n_seq slots (the protocol in the module docstring)."""
        self._check_serve(prompts, arrivals, max_tokens, n_batch)
        lib.llama_memory_clear(self.mem, True)
        smpl = self.smpl_no_eog if ignore_eos else self.smpl
        reqs = [_Request(ids, float(a)) for ids, a in zip(prompts, arrivals)]
        queue = sorted(range(len(reqs)), key=lambda r: (reqs[r].arrival_s, r))
        slots: list[_Request | None] = [None] * self.n_seq
        steps: list[list] = []
        t0 = time.perf_counter()
        while queue or any(r is not None for r in slots):
            now = time.perf_counter() - t0
            while queue and reqs[queue[0]].arrival_s <= now and None in slots:
                self._admit(reqs[queue.pop(0)], slots, slots.index(None), now)
            if all(r is None for r in slots):  # idle: the server waits on its task queue
                time.sleep(max(0.0, reqs[queue[0]].arrival_s - now))
                continue
            n_dec = sum(r is not None and r.generating for r in slots)
            items, outs = _slot_batch(slots, n_batch)
            self._decode(items)
            steps.append([time.perf_counter() - t0, n_dec, len(items) - n_dec])
            for i, r in outs:
                self._emit(r, self._argmax(i, smpl), time.perf_counter() - t0, max_tokens, slots)
        streams = [{"prompt_tokens": len(r.ids), "arrival_s": r.arrival_s, "start_s": r.start_s, "slot": r.slot,
                    "token_ids": r.token_ids, "times": r.times, "stop": r.stop} for r in reqs]
        return {"streams": streams, "wall_s": time.perf_counter() - t0, "n_slots": self.n_seq, "n_batch": n_batch,
                "steps": steps}

    def _check_serve(self, prompts: list[list[int]], arrivals: list[float], max_tokens: int, n_batch: int) -> None:
        if len(arrivals) != len(prompts):
            raise ValueError(f"serve: {len(prompts)} prompts but {len(arrivals)} arrivals")
        if not 1 <= n_batch <= N_BATCH:
            raise ValueError(f"serve: n_batch {n_batch} outside 1..{N_BATCH} (the context's n_batch)")
        if max_tokens < 1:
            raise ValueError(f"serve: max_tokens {max_tokens} < 1")
        cells = lib.llama_n_ctx_seq(self.ctx)
        for r, ids in enumerate(prompts):
            if not ids or len(ids) + max_tokens > cells:
                raise ValueError(f"serve: prompt {r} has {len(ids)} tokens; with max_tokens {max_tokens} it needs "
                                 f"1..{cells} cells (llama_n_ctx_seq)")

    def _admit(self, r: _Request, slots: list, slot: int, now: float) -> None:
        """Request r takes a free slot: its sequence's cells are emptied, its prompt starts at position 0."""
        lib.llama_memory_seq_rm(self.mem, slot, -1, -1)
        r.slot, r.start_s, slots[slot] = slot, now, r

    def _emit(self, r: _Request, tok: int, now: float, max_tokens: int, slots: list) -> None:
        """Slot r sampled tok: a stop frees the slot, otherwise tok is fed at the next iteration."""
        r.generating = True
        if lib.llama_vocab_is_eog(self.vocab, tok):
            r.stop = "eos"
        else:
            r.token_ids.append(tok)
            r.times.append(now)
            r.next_tok = tok
            if len(r.token_ids) >= max_tokens:
                r.stop = "length"
        if r.stop is not None:
            slots[r.slot] = None

    def gen(self, ids: list[int], max_tokens: int) -> dict:
        out = self.parallel([ids], max_tokens)
        s = out["streams"][0]
        times = s["times"]
        n = len(times)
        return {"prompt_tokens": len(ids), "tokens": n, "token_ids": s["token_ids"], "times": times,
                "ttft_s": times[0] if n else out["wall_s"], "decode_s": times[-1] - times[0] if n else 0.0}


def main() -> None:
    model, n_ctx, n_seq, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    kv_unified = len(sys.argv) > 5 and sys.argv[5] == "1"
    w = Worker(model, n_ctx, n_seq, threads, kv_unified)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            if req["op"] == "gen":
                rep = w.gen(req["ids"], int(req.get("max_tokens", 16)))
            elif req["op"] == "parallel":
                rep = w.parallel(req["prompts"], int(req.get("max_tokens", 16)))
            elif req["op"] == "serve":
                rep = w.serve(req["prompts"], req["arrivals"], int(req.get("max_tokens", 128)),
                              int(req.get("n_batch", N_BATCH)), bool(req.get("ignore_eos", False)))
            else:
                rep = {"error": f"unknown op {req['op']}"}
        except Exception as e:  # noqa: BLE001 - reported to the driver
            rep = {"error": repr(e)}
        sys.stdout.write(json.dumps(rep) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
