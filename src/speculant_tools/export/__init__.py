"""Hand-built ONNX graphs for a Llama target, its chained drafter and a draft model; the
package writer, the dtype conversion and the Hugging Face write-back.

    from speculant_tools.export import write_pair_package, read_weights, convert, export_hf
    write_pair_package("pair", target_weights, hf_config, drafter_weights, "tokenizer.json")
    config, target_weights, drafter_weights = read_weights("pair")   # exact round trip
    convert("pair", "pair-fp16", dtype="float16")
    export_hf("pair", "hf")            # config.json + model.safetensors (+ drafter.safetensors)

Weights are numpy arrays keyed by Hugging Face names (``config`` lists them); the graphs
keep those names for their initializers. The drafter carries its own copy of the tied table
(its first ``config.draft_vocab_size`` rows: a subset vocabulary where fewer than all) under
the target's name ``model.embed_tokens.weight``. Modules: ``config`` (sizes, names,
checks), ``graphs`` (ONNX), ``metadata`` (documents), ``package`` (disk), ``hf`` (write-back).
"""

from speculant_tools.export.config import ExportError, LlamaConfig, drafter_shapes, target_shapes
from speculant_tools.export.graphs import drafter_graph, target_graph
from speculant_tools.export.hf import export_hf
from speculant_tools.export.package import (
    convert,
    read_weights,
    write_decoder_package,
    write_pair_package,
)
from speculant_tools.export.rope import RopeScaling, rope_tables

__all__ = [
    "ExportError", "LlamaConfig", "RopeScaling", "convert", "drafter_graph", "drafter_shapes",
    "export_hf", "read_weights", "rope_tables", "target_graph", "target_shapes",
    "write_decoder_package", "write_pair_package",
]
