"""softknn in LangChain and LlamaIndex, over the generated client (softknn_client):

    from softknn_integrations.langchain import SoftKNNRetriever, SoftKNNEmbeddings   # langchain-core
    from softknn_integrations.llama_index import SoftKNNRetriever                    # llama-index-core

Each retriever sends the query to POST /v1/infer and returns its evidence, in rank order (memory
mass share), as the framework's documents; `evidence_metadata` says which fields they carry."""

from softknn_integrations.common import SoftKNNError, connect, evidence_metadata, search

__all__ = ["SoftKNNError", "connect", "evidence_metadata", "search"]
