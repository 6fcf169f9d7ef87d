"""The naive alternative for bench/service.py: FastAPI calling encode + FAISS search per request.

    python -m bench.naive_service --bundle DIR --port P      # binds 127.0.0.1 only

No batching, no fused pass, no evidence: each POST /search {"inputs": [...], "k": 8} runs
SentenceTransformer.encode on its texts and IndexFlatIP.search over the bundle's embeddings
(the same chunks softknn serves), in the request's own worker thread, and returns ids and scores.
"""

# No `from __future__ import annotations`: FastAPI must see the local body model class itself.

import argparse
import os


def create_app(bundle: str):
    import faiss
    import numpy as np
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    from softknn.model.encoder import resolve_model_path

    xb = np.load(os.path.join(bundle, "embeddings.npy"))
    index = faiss.IndexFlatIP(xb.shape[1])
    index.add(xb)
    from bench.kb import device

    model = SentenceTransformer(resolve_model_path(None), device=device(), local_files_only=True)

    class Query(BaseModel):
        inputs: list[str]
        k: int = 8

    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/search")
    def search(q: Query) -> dict:  # a plain def: FastAPI runs it in its thread pool, one per request
        xq = model.encode(q.inputs, convert_to_numpy=True, normalize_embeddings=True)
        D, I = index.search(np.ascontiguousarray(xq, dtype=np.float32), q.k)
        return {"results": [{"ids": i.tolist(), "scores": d.tolist()} for d, i in zip(D, I, strict=True)]}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--port", type=int, default=8001)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    uvicorn.run(create_app(args.bundle), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
