"""Hugging Face's names of a decoder layer's attention (``config.json``'s ``layer_types``):
read by the exporter's configuration and by the importers' family table, which the
configuration consults (so this is a leaf module both import)."""

SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (FULL, SLIDING)
