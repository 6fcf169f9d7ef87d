"""Prompt-stuffed RAG in llama.cpp (llama-cpp-python), for `python -m bench generation llama_cpp`.

Runs in llama-cpp-python's own environment (it is not a dependency of softknn): reads a JSON list of
{"k", "q", "prompt"} (the prompt text, special tokens as text), answers each greedily with one thread
and a fresh KV cache, and writes [{"k", "q", "prompt_tokens", "ttft_s", "decode_s", "tokens"}].

    VENV/bin/python bench/llama_cpp_worker.py MODEL.gguf PROMPTS.json OUT.json MAX_TOKENS REPEATS
"""

import json
import sys
import time

from llama_cpp import Llama


def main() -> None:
    model, prompts_path, out_path, max_tokens, repeats = sys.argv[1:6]
    prompts = json.loads(open(prompts_path, encoding="utf-8").read())
    llm = Llama(model_path=model, n_ctx=8192, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
    out = []
    for rep in range(int(repeats)):
        for item in prompts:
            ids = llm.tokenize(item["prompt"].encode("utf-8"), add_bos=False, special=True)
            llm.reset()  # no prefix reuse between prompts: each is a cold prefill, as softknn's is
            t0 = time.perf_counter()
            t_first, n = None, 0
            for _ in llm.generate(ids, temp=0.0, reset=True):
                n += 1
                if t_first is None:
                    t_first = time.perf_counter()
                if n >= int(max_tokens):
                    break
            t_end = time.perf_counter()
            out.append({"k": item["k"], "q": item["q"], "rep": rep, "prompt_tokens": len(ids),
                        "ttft_s": (t_first or t_end) - t0, "decode_s": t_end - (t_first or t_end), "tokens": n})
    open(out_path, "w", encoding="utf-8").write(json.dumps(out))


if __name__ == "__main__":
    main()
