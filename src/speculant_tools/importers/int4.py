"""``--quantize int4``: the target's linear layers as ONNX Runtime's ``MatMulNBits``.

Weights are quantized blockwise (32 per block, symmetric 4-bit, one float32 scale per block)
by ONNX Runtime's own ``MatMulNBitsQuantizer``; the token table stays float32 (a Gather reads
one row per token), the LM head is quantized like the other layers.

``accuracy_level`` 1 (float32 compute) is the only level that keeps speculation exact: with
level 4 (int8 activations) a k-token verification pass gave other tokens than k one-token
passes on SmolLM2 (prompt lookup != greedy on 3 of 4 chat prompts), with level 1 it did not
(tests/importers: the tiny model at k = 1, 2, 4; the real model at k = 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

BLOCK_SIZE = 32
ACCURACY_LEVEL = 1  # float32 compute: a k-token pass equals k one-token passes
# A drafter's weights decide only what is verified, never what is committed, so its passes
# may compute with int8 activations (level 4): SmolLM2's drafter on 2 CPU cores, 46 -> 9 MB,
# the same acceptance, chained k=4 1.14x -> 1.33x greedy
# (docs/benchmarks/2026-12-04-cpu-smollm2-int4-drafter/)
DRAFTER_ACCURACY_LEVEL = 4


def _pretranspose(model: onnx.ModelProto) -> None:
    """``MatMul(x, Transpose(W))`` -> ``MatMul(x, W_T)`` with ``W_T`` an initializer: the
    quantizer only takes a MatMul whose weight is a constant."""
    initializers = {t.name: t for t in model.graph.initializer}
    replaced: dict[str, str] = {}
    kept = []
    for node in model.graph.node:
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        if node.op_type == "Transpose" and node.input[0] in initializers and perm == [[1, 0]]:
            weight = numpy_helper.to_array(initializers[node.input[0]])  # [out, in]
            name = f"{node.input[0]}.T"
            if name not in initializers:
                initializers[name] = numpy_helper.from_array(np.ascontiguousarray(weight.T),
                                                             name)
                model.graph.initializer.append(initializers[name])
            replaced[node.output[0]] = name
        else:
            kept.append(node)
    for node in kept:
        for index, name in enumerate(node.input):
            node.input[index] = replaced.get(name, name)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    used = {name for node in model.graph.node for name in node.input}
    live = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(live)


def quantize_int4(path: Path, accuracy_level: int = ACCURACY_LEVEL) -> int:
    """Rewrite the float32 graph at ``path`` with int4 MatMulNBits; returns their count
    (the caller checked the dtype: ``checkpoint.check_quantize``)."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(path))
    _pretranspose(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=BLOCK_SIZE, is_symmetric=True,
                                     accuracy_level=accuracy_level)
    quantizer.process()
    quantized = quantizer.model.model
    count = sum(node.op_type == "MatMulNBits" for node in quantized.graph.node)
    onnx.save(quantized, str(path))
    return count
