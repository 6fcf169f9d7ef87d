"""The retrieval layer: R per input over a bundle (search), its score math (scoring), the FAISS and BM25
indexes, filters, reranking and calibration."""
