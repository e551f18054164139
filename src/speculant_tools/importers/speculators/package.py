"""Write the pair of a speculators EAGLE head and the target package it drafts for.

    import_speculators("Llama-speculator.eagle3/", "my-llama", "pair")

The target comes from a package ``speculant_tools.export`` wrote (a folder, or a built-in
name): its weights are read back, the Llama target graph is rebuilt node by node with the
head's cells (``graphs.extend_target``) and the head becomes the chained drafter
(``graphs.drafter_graph``). The document is the exported pair's (``export.metadata``) with
the head's cells in the target's group, the drafter borrowing ``eagle.key``/``eagle.value``,
the seed ``eagle_seed``, the embeddings unscaled (EAGLE adds the verifier's rows as they
are), and, where the head drafts over ``V_q < V`` ids, ``vocabulary: {kind: mapped,
artifact: draft_to_target.i64}`` (``arange(V_q) + d2t``, raw little-endian int64).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from speculant.errors import MetadataError
from speculant.package.builtin import resolve_package
from speculant_tools.export.config import (
    EMBEDDING,
    ExportError,
    LlamaConfig,
    check_dtype,
    checked_weights,
    target_shapes,
)
from speculant_tools.export.graphs import target_graph
from speculant_tools.export.metadata import pair_metadata, static_cache_form
from speculant_tools.export.package import (
    _rollback,
    check_cache,
    read_settings,
    read_weights,
    tokenizer_facts,
    write_graph,
)
from speculant_tools.importers.checkpoint import TOKENIZER_CONFIG, ImporterError, Progress
from speculant_tools.importers.speculators.checkpoint import EagleHead, read_speculators
from speculant_tools.importers.speculators.graphs import (
    CARRY,
    FEATURE,
    KEY,
    SEED,
    VALUE,
    aux_layer_ids,
    drafter_graph,
    extend_target,
    widths,
)
from speculant_tools.writing import contract, opaque_input, write_metadata

VOCABULARY_MAP = "draft_to_target.i64"
WF = "pipeline.workflow"


def import_speculators(source: str | Path, target: str | Path, out: str | Path, *,
                       dtype: str | None = None, cache: str | None = None,
                       max_proposal_width: int | None = None,
                       progress: Progress | None = None) -> Path:
    """The pair package of the head in ``source`` and the package ``target`` (a folder or a
    built-in name) in ``out``. ``dtype`` and ``cache`` default to the target package's;
    ``max_proposal_width`` (the carry's window) to the head's ``speculative_tokens``."""
    head = read_speculators(source)
    root = resolve_package(target)
    try:
        settings = read_settings(root)
        config, weights, _ = read_weights(root, skip_int4_drafter=True)
    except (ExportError, MetadataError) as error:
        raise ImporterError(f"the target is not a package speculant's export wrote: {error}",
                            file=str(root), path="target",
                            remedy="import or export the target first (speculant import "
                                   "MODEL OUT)") from None
    dtype, cache = check_dtype(dtype or settings.dtype), check_cache(cache or settings.cache)
    width = max_proposal_width or head.speculative_tokens
    rollback = _rollback(max(settings.rollback_positions, width), width)
    check_pair(head, config, weights)
    if progress is not None:
        progress(f"writing the {head.algorithm} pair", 0, 1)
    arrays = checked_weights(weights, target_shapes(config), dtype, "target weights")
    taps: dict[str, Any] = {}
    model = target_graph(config, arrays, dtype, cache=cache, taps=taps)
    extend_target(model, taps, head, config, dtype, cache, width)
    out = Path(out)
    write_graph(model, out / "target" / "model.onnx")
    write_graph(drafter_graph(head, config, arrays[EMBEDDING], dtype, cache, width),
                out / "assistant" / "model.onnx")
    document = eagle_metadata(head, config, dtype, tokenizer_facts(settings.tokenizer,
                                                                   settings.eos_id),
                              width=width, rollback_positions=rollback)
    if cache == "static":
        document = static_cache_form(document, config)
    write_metadata(document, out, f"{head.algorithm} head from {head.source} (verifier "
                   f"{head.verifier}) beside the target of {root}, {dtype}: speculant import.")
    ids = head.draft_to_target()
    if ids is not None:
        ids.astype("<i8").tofile(out / VOCABULARY_MAP)
    for name in ("tokenizer.json", TOKENIZER_CONFIG):
        if (root / name).is_file():
            shutil.copyfile(root / name, out / name)
    if progress is not None:
        progress(f"wrote {out}", 1, 1)
    return out


def check_pair(head: EagleHead, config: LlamaConfig, weights: dict[str, np.ndarray]) -> None:
    """The head fits the target: one hidden width and vocabulary, the verifier's own
    embeddings (and, for EAGLE-1, LM head), aux layers the target has."""
    layer, source = head.layer, head.source
    for key, mine, theirs in (("hidden_size", layer.hidden_size, config.hidden_size),
                              ("vocab_size", layer.vocab_size, config.vocab_size)):
        if mine != theirs:
            raise ImporterError(f"the head's {key} is not the target's", file=source,
                                path=f"transformer_layer_config.{key}", value=mine,
                                expected=str(theirs), remedy="import the head beside the "
                                f"verifier it was trained for ({head.verifier})")
    table = weights[EMBEDDING]
    for name in ("embed_tokens.weight", "lm_head.weight" if head.algorithm == "eagle" else ""):
        if name in head.weights and not np.allclose(head.weights[name], table, atol=1e-6):
            raise ImporterError(f"the head's {name} differs from the target's table: the chain "
                                "embeds with the target's table (and EAGLE-1 scores with it)",
                                file=source, path=name, remedy="import the head beside the "
                                f"verifier it was trained for ({head.verifier})")
    if head.algorithm == "eagle3":
        ids = head.aux_layer_ids or aux_layer_ids(config.num_hidden_layers)
        if not all(0 <= i < config.num_hidden_layers for i in ids):
            raise ImporterError("an aux layer the target does not have", file=source,
                                path="eagle_aux_hidden_state_layer_ids", value=list(ids),
                                expected=f"ids in [0, {config.num_hidden_layers})")


def eagle_metadata(head: EagleHead, config: LlamaConfig, dtype: str, tokenizer: Any, *,
                   width: int, rollback_positions: int) -> dict[str, Any]:
    """The exported pair's document with the head's cells, ports and vocabulary."""
    w = widths(head, width)
    kv = head.layer.num_key_value_heads
    document = pair_metadata(config, dtype, tokenizer, scale=1.0, max_proposal_width=width,
                             rollback_positions=rollback_positions)
    workflow = document[WF.split(".")[0]][WF.split(".")[1]]
    cells = {FEATURE: ("feature", 1, w.hidden), KEY: ("key", kv, head.layer.head_dim),
             VALUE: ("value", kv, head.layer.head_dim)}

    def cell(symbol: str, heads: int, row: int) -> dict[str, Any]:
        return contract(dtype, ["batch", heads, symbol, row])

    target = workflow["components"]["target"]["ports"]
    invoke, proposer_invoke = workflow["steps"][0], workflow["steps"][1]
    group = workflow["serving"]["state_service"]["groups"]["attention"]
    for name, (part, heads, row) in cells.items():
        target["inputs"][f"past_eagle.{part}"] = cell("past_sequence", heads, row)
        target["outputs"][f"present_eagle.{part}"] = cell("total_sequence", heads, row)
        workflow["inputs"][f"request.past.{name}"] = opaque_input(
            f"past.{name}", cell("past_sequence", heads, row))
        workflow["state"][name] = {**workflow["state"]["kv.0.key"],
                                   "contract": cell("past_sequence", heads, row),
                                   "initializer": f"request.past.{name}"}
        invoke["inputs"][f"past_eagle.{part}"] = f"request.past.{name}"
        invoke["outputs"][f"present_eagle.{part}"] = f"target.present_eagle.{part}"
        group["ports"]["target"][name] = {"input": f"past_eagle.{part}",
                                          "output": f"present_eagle.{part}"}
    target["outputs"][SEED] = contract(dtype, ["batch", "sequence", w.carry])
    invoke["outputs"][SEED] = f"target.{SEED}"

    fused = contract(dtype, ["batch", "sequence", w.hidden + w.carry])
    assistant = workflow["components"]["assistant"]["ports"]
    borrowed = cell("kv_sequence", kv, head.layer.head_dim)
    assistant["inputs"] = {"inputs_embeds": fused, **{
        port: body for port, body in assistant["inputs"].items()
        if port in ("position_ids", "attention_mask")}, KEY: borrowed, VALUE: dict(borrowed)}
    assistant["outputs"] = {
        "logits": contract(dtype, ["batch", "sequence",
                                   head.draft_vocab_size or config.vocab_size]),
        CARRY: contract(dtype, ["batch", "sequence", w.carry])}
    workflow["inputs"]["request.inputs_embeds"]["contract"] = dict(fused)
    proposer_invoke["inputs"] = {**{port: value for port, value in
                                    proposer_invoke["inputs"].items()
                                    if not port.startswith("shared_kv.")},
                                 KEY: "target.present_eagle.key",
                                 VALUE: "target.present_eagle.value"}
    group["ports"]["assistant"] = {
        KEY: {"input": KEY, "access": "read_only", "role": "key"},
        VALUE: {"input": VALUE, "access": "read_only", "role": "value"}}
    spec = document["speculative"]
    execution = spec["proposal_execution"]
    execution["folded_carry_seed"]["output"] = SEED
    del execution["token_embedding"]["scale"]  # EAGLE adds the verifier's rows unscaled
    if head.draft_to_target() is not None:
        spec["vocabulary"] = {"kind": "mapped", "artifact": VOCABULARY_MAP}
    spec["rollback_state"] = [*spec["rollback_state"], *cells]
    return document
