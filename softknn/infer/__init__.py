"""The inference layer: the Engine (model + bundle: retrieval, the fused pass, evidence), its typed results,
and the plain reference beside it."""
