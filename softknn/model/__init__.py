"""The model layer: the seams (Protocols and shared types), the encoder and its runtimes, the fused attention."""
