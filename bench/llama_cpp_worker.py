"""llama.cpp (libllama of the `llama-cpp-py-sync` wheel, through its CFFI C API) for `python -m bench
generation llama_cpp`: prompt-stuffed RAG on the same token ids softknn builds, one stream or several
decoded together (server-style parallel decoding: one llama_decode per step over every running
sequence).

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
    {"op": "quit"}

    LD_PRELOAD=…/libisoc23shim.so VENV/bin/python bench/llama_cpp_worker.py MODEL.gguf N_CTX N_SEQ THREADS
"""

import json
import sys
import time

from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

lib, ffi = get_lib(), get_ffi()
N_BATCH = 512


@ffi.callback("void(enum ggml_log_level, const char *, void *)")
def _quiet(level, text, user):  # stdout is the protocol: drop llama.cpp's log lines
    return None


class Worker:
    def __init__(self, model_path: str, n_ctx: int, n_seq: int, threads: int):
        lib.llama_log_set(_quiet, ffi.NULL)
        lib.llama_backend_init()
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(model_path.encode(), mp)
        assert self.model != ffi.NULL, "model load failed"
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, N_BATCH, N_BATCH
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.embeddings = False
        self.ctx = lib.llama_init_from_model(self.model, cp)
        assert self.ctx != ffi.NULL, "context init failed"
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.mem = lib.llama_get_memory(self.ctx)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
        self.batch = lib.llama_batch_init(max(N_BATCH, n_seq), 0, 1)
        self.smpl = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        lib.llama_sampler_chain_add(self.smpl, lib.llama_sampler_init_greedy())

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

    def _argmax(self, i: int) -> int:
        """The greedy token at batch output i (−1: the last), llama.cpp's own sampler."""
        return int(lib.llama_sampler_sample(self.smpl, self.ctx, i))

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

    def gen(self, ids: list[int], max_tokens: int) -> dict:
        out = self.parallel([ids], max_tokens)
        s = out["streams"][0]
        times = s["times"]
        n = len(times)
        return {"prompt_tokens": len(ids), "tokens": n, "token_ids": s["token_ids"], "times": times,
                "ttft_s": times[0] if n else out["wall_s"], "decode_s": times[-1] - times[0] if n else 0.0}


def main() -> None:
    model, n_ctx, n_seq, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    w = Worker(model, n_ctx, n_seq, threads)
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
            else:
                rep = {"error": f"unknown op {req['op']}"}
        except Exception as e:  # noqa: BLE001 - reported to the driver
            rep = {"error": repr(e)}
        sys.stdout.write(json.dumps(rep) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
