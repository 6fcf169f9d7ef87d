"""The retrieval's fallback defaults, in a module that imports nothing: the parameter table
(softknn.params) and through it the `softknn` command read them before numpy loads."""

from __future__ import annotations

RETRIEVALS = ("hybrid", "dense", "lexical")
# Defaults of the external k-NN's similarity, chosen on validation splits only (docs/quality.md,
# "Hybrid retrieval"; bench/hybrid_obliqa.py, bench/hybrid_banking77.py):
# - λ = 0.6, m = 200, with BM25 k1 = 0.9 (softknn.retrieval.lexical): ObliQA validation nDCG@10 0.716, the
#   best of 180 cells (λ 0.5: 0.709, 0.7: 0.715; m 100: 0.715), against 0.568 dense and 0.690 BM25;
# - τ: the hybrid and lexical scores lie in [0, 1] with the best at 1, a wider scale than the
#   dense cosine's top k, so their bandwidth is wider: τ 0.25 was best on average over the
#   λ × m cells of the Banking77 leave-one-out (dense: 0.05, unchanged).
# A labelled KB gets its own λ and τ by leave-one-out at build time, an unlabelled one its own λ
# from held-out sentences of its chunks (softknn.retrieval.calibration), stored in the manifest's
# calibration.retrieval_defaults; these are the fallbacks (bundles built before, too few sentences).
DEFAULT_TEMPERATURE = {"dense": 0.05, "hybrid": 0.25, "lexical": 0.25}
LEXICAL_WEIGHT = 0.6
CANDIDATES = 200
