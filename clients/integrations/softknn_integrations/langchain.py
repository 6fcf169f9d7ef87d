"""LangChain (langchain-core): a retriever over softknn's evidence and softknn's embeddings.

    from softknn_integrations import connect
    from softknn_integrations.langchain import SoftKNNEmbeddings, SoftKNNRetriever
    client = connect("http://127.0.0.1:8000", api_key=None)
    docs = SoftKNNRetriever(client=client, k=4).invoke("Can I bring my dog on the ferry?")
    docs[0].metadata["w_db"], docs[0].metadata["spans"]

The retriever's documents are /v1/infer's evidence items in rank order (memory-mass share), the
chunk's text as page_content, its id as the document id, softknn's fields in metadata
(softknn_integrations.common.evidence_metadata). The embeddings are /v1/embeddings': the plain
model's, or the knowledge-augmented ones with `augmented=True`."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from softknn_integrations.common import aembed, asearch, embed, evidence_metadata, search


def _document(item, bundle_version: str) -> Document:
    return Document(page_content=item.text, metadata=evidence_metadata(item, bundle_version), id=item.chunk_id)


class SoftKNNRetriever(BaseRetriever):
    """The evidence of POST /v1/infer for the query: `k` chunks retrieved and returned.

    `alpha`, `mixing`, `retrieval`, `lexical_weight`, `temperature`, `exact`, `spans`: /v1/infer's
    fields of the same names (None: the server's default)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any = Field(description="a softknn_client Client or AuthenticatedClient (softknn_integrations.connect)")
    k: int = 4
    alpha: float | None = None
    mixing: str | None = None
    retrieval: str | None = None
    lexical_weight: float | None = None
    temperature: float | None = None
    exact: bool | None = None
    spans: int | None = None

    def _params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "mixing": self.mixing, "retrieval": self.retrieval,
                "lexical_weight": self.lexical_weight, "temperature": self.temperature, "exact": self.exact,
                "spans": self.spans}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        version, items = search(self.client, query, self.k, **self._params())
        return [_document(it, version) for it in items]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        version, items = await asearch(self.client, query, self.k, **self._params())
        return [_document(it, version) for it in items]


class SoftKNNEmbeddings(Embeddings):
    """POST /v1/embeddings: the plain model's embeddings (sentence-transformers' own output), or with
    `augmented=True` the knowledge-augmented ones, `options` being softknn's retrieval parameters
    (k, alpha, mixing, retrieval, ...: the request's `softknn` object)."""

    def __init__(self, client, *, model: str | None = None, augmented: bool = False,
                 options: dict[str, Any] | None = None):
        self.client, self.model = client, model
        self.softknn = {"augmented": True, **(options or {})} if augmented else (options or None)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return embed(self.client, texts, model=self.model, softknn=self.softknn) if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await aembed(self.client, texts, model=self.model, softknn=self.softknn) if texts else []

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]
