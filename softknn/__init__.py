"""softknn: a transformer's attention extended, without retraining, to a FAISS-indexed knowledge base.

Self-attention is a soft k-nearest-neighbour search (seed 000); softknn adds a second one over an
external KB and fuses the two at one memory layer, returning the evidence that drew the weight.
"""

__version__ = "0.1.0"
