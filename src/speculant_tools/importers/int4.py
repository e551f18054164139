"""``--quantize int4``: the target's linear layers as ONNX Runtime's ``MatMulNBits``;
``--quantize-drafter int4``: a chained drafter's (:func:`quantize_drafter`); a GGUF's blocks
kept as they are where MatMulNBits computes with them exactly (:func:`keep_nbits`).

Weights are quantized blockwise (32 per block, symmetric 4-bit, one float32 scale per block)
by ONNX Runtime's own ``MatMulNBitsQuantizer``; the token table stays float32 (a Gather reads
one row per token), the LM head is quantized like the other layers.

``accuracy_level`` 1 (float32 compute) is the only level that keeps speculation exact: with
level 4 (int8 activations) a k-token verification pass gave other tokens than k one-token
passes on SmolLM2 (prompt lookup != greedy on 3 of 4 chat prompts), with level 1 it did not
(tests/importers: the tiny model at k = 1, 2, 4; the real model at k = 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

if TYPE_CHECKING:
    from speculant_tools.importers.gguf_quant import NBits

MS_DOMAIN = "com.microsoft"
INLINE_LIMIT = 1 << 30  # bytes of initializers written inside the protobuf (limit: 2 GiB)

BLOCK_SIZE = 32
ACCURACY_LEVEL = 1  # float32 compute: a k-token pass equals k one-token passes
# A drafter's weights decide only what is verified, never what is committed, so its passes
# may compute with int8 activations (level 4): SmolLM2's drafter on 2 CPU cores, 46 -> 9 MB,
# the same acceptance, chained k=4 1.14x -> 1.33x greedy
# (docs/benchmarks/2026-12-04-cpu-smollm2-int4-drafter/)
DRAFTER_ACCURACY_LEVEL = 4
DRAFTER_QUANTIZATIONS = (None, "int4")


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


def quantize_int4(path: Path, accuracy_level: int = ACCURACY_LEVEL, *, bits: int = 4,
                  block_size: int = BLOCK_SIZE, symmetric: bool = True,
                  keep: frozenset[str] = frozenset()) -> int:
    """Rewrite the float32 graph at ``path`` with int4 MatMulNBits; returns their count
    (the caller checked the dtype: ``checkpoint.check_quantize``). ``bits``, ``block_size``,
    ``symmetric`` and ``keep`` (weights left in float) choose other variants to compare."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(path), load_external_data=False)
    external = {entry.value for tensor in model.graph.initializer
                if external_data_helper.uses_external_data(tensor)
                for entry in tensor.external_data if entry.key == "location"}
    external_data_helper.load_external_data_for_model(model, str(path.parent))
    _pretranspose(model)
    kept = [node.name for node in model.graph.node if node.op_type == "MatMul"
            and any(name.removesuffix(".T") in keep for name in node.input)]
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size,
                                     is_symmetric=symmetric, accuracy_level=accuracy_level,
                                     nodes_to_exclude=kept)
    quantizer.process()
    quantized = quantizer.model.model
    count = sum(node.op_type == "MatMulNBits" for node in quantized.graph.node)
    onnx.save(quantized, str(path))  # inline: int4 weights are an eighth of float32's
    for location in external:
        (path.parent / location).unlink(missing_ok=True)
    return count


def keep_nbits(path: Path, weights: Mapping[str, NBits]) -> int:
    """Rewrite the float32 graph at ``path`` so that each ``MatMul(x, Transpose(W))`` with
    ``W`` named in ``weights`` (HF name) is a 4-bit ``MatMulNBits`` with that weight's codes
    and scales (``gguf_quant.NBits``: no zero point, float32 compute); returns their count.
    Other weights keep their names and layout; a weight packed with others (the fused graph's
    q/k/v Concat) stays float."""
    model = onnx.load(str(path), load_external_data=False)
    external_data_helper.load_external_data_for_model(model, str(path.parent))
    producers = {output: node for node in model.graph.node for output in node.output}
    added = []
    for node in model.graph.node:
        source = producers.get(node.input[1]) if node.op_type == "MatMul" else None
        if source is None or source.op_type != "Transpose" or source.input[0] not in weights:
            continue
        name, nbits = source.input[0], weights[source.input[0]]
        num_rows, num_blocks, _ = nbits.packed.shape
        added += [numpy_helper.from_array(nbits.packed, f"{name}.nbits"),
                  numpy_helper.from_array(nbits.scales.reshape(-1), f"{name}.scales")]
        node.op_type, node.domain = "MatMulNBits", MS_DOMAIN
        node.input[1] = f"{name}.nbits"
        node.input.append(f"{name}.scales")
        node.attribute.extend(onnx.helper.make_attribute(key, value) for key, value in (
            ("K", num_blocks * nbits.block_size), ("N", num_rows), ("bits", 4),
            ("block_size", nbits.block_size), ("accuracy_level", ACCURACY_LEVEL)))
    read = {name for node in model.graph.node for name in node.input}
    read |= {output.name for output in model.graph.output}
    nodes = [node for node in model.graph.node
             if node.op_type != "Transpose" or node.output[0] in read]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    live = [t for t in model.graph.initializer if t.name in used] + added
    del model.graph.initializer[:]
    model.graph.initializer.extend(live)
    if added and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    _save(model, path)
    return len(added) // 2


def _save(model: onnx.ModelProto, path: Path) -> None:
    """``model`` at ``path``: inline, or with its initializers in ``<name>.data`` beside it
    where they would not fit one protobuf (as export.package.write_graph writes them)."""
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    size = sum(t.ByteSize() for t in model.graph.initializer)
    if size < INLINE_LIMIT:
        onnx.save(model, str(path))
    else:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data.name, size_threshold=1024)


def check_drafter_quantization(quantization: str | None, package: Path,
                               drafter: Path | None) -> str | None:
    """``quantization`` if it is one of :data:`DRAFTER_QUANTIZATIONS` and, when it is not
    None, the package at ``package`` has a ``drafter`` graph to apply it to (an ExportError
    otherwise): checked before a package is written."""
    from speculant_tools.export.config import ExportError

    if quantization not in DRAFTER_QUANTIZATIONS:
        raise ExportError("unknown drafter quantization", path="quantize_drafter",
                          value=quantization, expected="int4, or none")
    if quantization is not None and drafter is None:
        raise ExportError("the package has no chained drafter to quantize", file=str(package),
                          path="quantize_drafter", value=quantization,
                          remedy="quantize a pair's drafter (a package written with one), or "
                                 "leave --quantize-drafter out")
    return quantization


def quantize_drafter(package: Path, quantization: str | None) -> int:
    """The chained drafter of the pair at ``package`` (``assistant/model.onnx``) with its
    linear layers as int4 ``MatMulNBits`` at :data:`DRAFTER_ACCURACY_LEVEL`, in any dtype:
    a draft decides only what is verified, never what is committed, so the outputs stay
    greedy's and only acceptance may move. On CUDA a drafter step's seven matrix-vector
    products read a quarter of the bytes (docs/benchmarks/2026-12-04-cuda-real1b-int4-drafter/).
    Returns the count of MatMulNBits (0 for ``None``)."""
    path = Path(package) / "assistant" / "model.onnx"
    if check_drafter_quantization(quantization, package,
                                  path if path.is_file() else None) is None:
        return 0
    return quantize_int4(path, DRAFTER_ACCURACY_LEVEL)
