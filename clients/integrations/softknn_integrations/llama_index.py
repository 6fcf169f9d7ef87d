"""LlamaIndex (llama-index-core): a retriever over softknn's evidence.

    from softknn_integrations import connect
    from softknn_integrations.llama_index import SoftKNNRetriever
    nodes = SoftKNNRetriever(connect("http://127.0.0.1:8000"), k=4).retrieve("Can I bring my dog on the ferry?")
    nodes[0].score, nodes[0].node.metadata["spans"]

Each NodeWithScore is one of /v1/infer's evidence items, in rank order (memory-mass share): a
TextNode with the chunk's id, text and char span in its document (the document as its SOURCE
relationship), softknn's fields in metadata (softknn_integrations.common.evidence_metadata), and
w_db, the chunk's k-NN weight over the retrieved set, as the score."""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeRelationship, NodeWithScore, QueryBundle, RelatedNodeInfo, TextNode

from softknn_integrations.common import asearch, evidence_metadata, search

# kept out of the text an LLM or an embedding model is shown (TextNode.get_content with metadata)
HIDDEN = ["chunk_id", "start", "end", "rank", "w_db", "similarity", "dense_similarity", "bm25", "matched_terms",
          "mass_share", "influence", "spans", "chunk_metadata", "bundle_version"]


def _node(item, bundle_version: str) -> NodeWithScore:
    node = TextNode(id_=item.chunk_id, text=item.text, metadata=evidence_metadata(item, bundle_version),
                    start_char_idx=item.start, end_char_idx=item.end,
                    excluded_llm_metadata_keys=list(HIDDEN), excluded_embed_metadata_keys=list(HIDDEN),
                    relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=item.doc_id)})
    return NodeWithScore(node=node, score=item.weight)


class SoftKNNRetriever(BaseRetriever):
    """The evidence of POST /v1/infer for the query: `k` chunks retrieved and returned; `params`:
    /v1/infer's alpha, mixing, retrieval, lexical_weight, temperature, exact, spans (unset: the
    server's default)."""

    def __init__(self, client, k: int = 4, **params: Any):
        super().__init__()
        self.client, self.k, self.params = client, k, params

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        version, items = search(self.client, query_bundle.query_str, self.k, **self.params)
        return [_node(it, version) for it in items]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        version, items = await asearch(self.client, query_bundle.query_str, self.k, **self.params)
        return [_node(it, version) for it in items]
