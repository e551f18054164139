"""Write exported packages to disk, read their weights back, rebuild them in another dtype.

    write_pair_package(root, target_weights, config, drafter_weights, "tokenizer.json")
    write_decoder_package(root, draft_weights, draft_config, "tokenizer.json")
    config, target_weights, drafter_weights = read_weights(root)   # drafter: None for a decoder
    convert(root, root_fp16, dtype="float16")

The graphs carry every weight under its Hugging Face name and the :class:`LlamaConfig` as
model metadata (``speculant.export.llama_config``, the key of the first release), so a
package is its own checkpoint.

``external_data``: None (the default) writes a graph's weights inline up to
:data:`~speculant_tools.export.graphs.INLINE_LIMIT` (1 GiB) and beside it above that, in
``model.onnx.data`` next to ``model.onnx`` (protobuf cannot hold 2 GiB); True or False forces
one or the other. speculant admits external data that stays inside the package folder.

``cache``: ``appended`` (the default) or ``static`` (fixed-capacity KV buffers written in
place, catalogue document 18's form; export/graphs.py, docs/design/static-cache.md). The
runtime admits static packages once it drives them; until then loading one is refused with
an UnsupportedError naming ``update.kind``.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from speculant_tools.export.batched import batchable, batched_target_graph
from speculant_tools.export.config import (
    EMBEDDING,
    ExportError,
    LlamaConfig,
    check_dtype,
    checked_weights,
    drafter_shapes,
    seed_fusion_shapes,
    target_shapes,
)
from speculant_tools.export.fused import fused_target_graph, use_fused
from speculant_tools.export.graphs import (
    CACHES,
    CONFIG_KEY,
    INLINE_LIMIT,
    drafter_graph,
    initializer_bytes,
    target_graph,
    uses_ort_operators,
)
from speculant_tools.export.metadata import (
    TokenizerFacts,
    batch_rows,
    batched_form,
    cache_form,
    decoder_metadata,
    pair_metadata,
    static_cache_form,
)
from speculant_tools.onnx_build import (
    fill_inline,
    is_apart,
    weights_apart,
    write_with_external_data,
)
from speculant_tools.writing import write_metadata, write_model

DEFAULT_ROLLBACK = 8
EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "<|end_of_text|>", "<|im_end|>")


# -- writing ------------------------------------------------------------------------------
def write_pair_package(root: str | Path, target_weights: Mapping[str, Any], target_config: Any,
                       drafter_weights: Mapping[str, Any], tokenizer_json_path: str | Path, *,
                       dtype: str = "float32", scale: float | None = None,
                       max_proposal_width: int = 8, eos_id: int | None = None,
                       rollback_positions: int | None = None,
                       external_data: bool | None = None, graph: str = "auto",
                       cache: str = "appended", batch: int | None = None) -> Path:
    """The chained pair: ``target/model.onnx``, ``assistant/model.onnx``,
    ``inference_metadata.yaml`` (the standard's chained-pair example), ``tokenizer.json``.

    ``target_config``: a :class:`LlamaConfig`, a ``transformers`` config or a config.json
    mapping; a :class:`LlamaConfig` with ``draft_vocab_size < vocab_size`` writes a subset
    vocabulary (the drafter's LM head ``model.embed_tokens.weight[:N]``, metadata
    ``vocabulary: {kind: subset, proposer_vocab_size: N}``). ``scale`` defaults to
    ``sqrt(hidden_size)``; ``rollback_positions`` to ``max(8, max_proposal_width)``;
    ``eos_id`` to the tokenizer's one special EOS token; ``graph`` picks the target's graph
    (export/fused.py: ``auto``, ``fused``, ``explicit``); ``cache`` its caches' form
    (``appended`` or ``static``; the drafter's borrowed caches follow); ``batch`` (static
    only): also write ``target/batched.onnx``, the batched pass of up to ``batch`` rows,
    beside which ``assistant/model.onnx`` steps ``B`` rows as it is (docs/design/batching.md).
    A config with ``seed_feature_layers`` (EAGLE-3's fused seed, docs/design/chained.md): the
    drafter weights include the seed projection, which goes into the target's graphs (every
    form above) as their ``fused_hidden_states`` output, the chain's ``folded_carry_seed``.
    """
    config = LlamaConfig.from_hf(target_config)
    dtype, cache = check_dtype(dtype), check_cache(cache)
    check_batch(batch, cache, config)
    target = checked_weights(target_weights, target_shapes(config), dtype, "target weights")
    drafter = checked_weights(drafter_weights, drafter_shapes(config), dtype, "drafter weights")
    target.update({name: drafter.pop(name) for name in seed_fusion_shapes(config)})
    scale = math.sqrt(config.hidden_size) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ExportError("scale must be a finite number > 0", path="scale", value=scale)
    rollback = _rollback(rollback_positions, max_proposal_width)
    root = Path(root)
    facts = tokenizer_facts(tokenizer_json_path, eos_id)
    build_graph(lambda: target_builder(config, dtype, graph)(config, target, dtype,
                                                             cache=cache),
                root / "target" / "model.onnx", external_data)
    build_graph(lambda: drafter_graph(config, drafter, target[EMBEDDING], dtype,
                                      fused_norms=use_fused(config, dtype, graph), cache=cache),
                root / "assistant" / "model.onnx", external_data)
    document = pair_metadata(config, dtype, facts, scale=scale,
                             max_proposal_width=max_proposal_width, rollback_positions=rollback)
    if cache == "static":
        document = static_cache_form(document, config)
    if batch is not None:
        build_graph(lambda: batched_target_graph(config, target, dtype),
                    root / "target" / "batched.onnx", external_data)
        document = batched_form(document, "target", batch, borrowers=("assistant",))
    write_metadata(document, root, _header("Chained Llama pair", config, dtype))
    _copy_tokenizer(tokenizer_json_path, root)
    return root


def write_decoder_package(root: str | Path, weights: Mapping[str, Any], config: Any,
                          tokenizer_json_path: str | Path, *, dtype: str = "float32",
                          eos_id: int | None = None,
                          rollback_positions: int = DEFAULT_ROLLBACK,
                          external_data: bool | None = None, graph: str = "auto",
                          cache: str = "appended", batch: int | None = None) -> Path:
    """A plain greedy decoder package (the standard's example; component ``decoder``) for a
    ``LlamaForCausalLM``: the separate draft model. ``cache``: ``appended`` or ``static``;
    ``batch``: as :func:`write_pair_package`'s (``decoder/batched.onnx``). A decoder seeds
    no drafter: a config's ``seed_feature_layers`` is dropped."""
    config = replace(LlamaConfig.from_hf(config), seed_feature_layers=None)
    dtype, cache = check_dtype(dtype), check_cache(cache)
    check_batch(batch, cache, config)
    arrays = checked_weights(weights, target_shapes(config), dtype, "decoder weights")
    root = Path(root)
    facts = tokenizer_facts(tokenizer_json_path, eos_id)
    build_graph(lambda: target_builder(config, dtype, graph)(config, arrays, dtype,
                                                             name="decoder", cache=cache),
                root / "decoder" / "model.onnx", external_data)
    document = decoder_metadata(config, dtype, facts,
                                rollback_positions=_rollback(rollback_positions, 1))
    if cache == "static":
        document = static_cache_form(document, config)
    if batch is not None:
        build_graph(lambda: batched_target_graph(config, arrays, dtype, name="decoder"),
                    root / "decoder" / "batched.onnx", external_data)
        document = batched_form(document, "decoder", batch)
    write_metadata(document, root, _header("Llama greedy decoder", config, dtype))
    _copy_tokenizer(tokenizer_json_path, root)
    return root


def target_builder(config: LlamaConfig, dtype: str, graph: str = "auto"
                   ) -> Callable[..., onnx.ModelProto]:
    """The target graph for ``config`` in ``dtype``: fused kernels (export/fused.py) or node
    by node, as :func:`~speculant_tools.export.fused.use_fused` decides for ``graph``."""
    return fused_target_graph if use_fused(config, dtype, graph) else target_graph


def check_cache(cache: str) -> str:
    if cache not in CACHES:
        raise ExportError(f"cache must be one of {CACHES}", path="cache", value=cache,
                          remedy="--cache appended (the default) or --cache static")
    return cache


def check_batch_form(batch: int | None, cache: str) -> None:
    """``batch`` None, or a row count ≥ 1 with ``cache`` static: what a command checks before
    it reads a model (:func:`check_batch` checks the model too)."""
    if batch is None:
        return
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ExportError("batch must be a number of rows >= 1", path="batch", value=batch,
                          remedy="leave batch (--batch) unset for a batch-1 package")
    if cache != "static":
        raise ExportError("a batched pass needs the static cache form", path="cache",
                          value=cache, remedy="--cache static")


def check_batch(batch: int | None, cache: str, config: LlamaConfig) -> None:
    """``batch`` None, or a row count ≥ 1 for a static package of a batchable target."""
    check_batch_form(batch, cache)
    if batch is not None and not batchable(config):
        raise ExportError("the batched pass has no sliding-window attention",
                          path="config.sliding_window", value=config.sliding_window,
                          remedy="leave batch (--batch) unset for a batch-1 package")


def build_graph(build: Callable[[], onnx.ModelProto], path: Path,
                external_data: bool | None = None) -> Path:
    """:func:`write_graph` of the model ``build`` returns, its weights built apart
    (``onnx_build.weights_apart``): with external data they go from their arrays straight to
    ``<name>.data`` and never into protobuf, so the import holds them once, not twice."""
    with weights_apart() as arrays:
        model = build()
    return write_graph(model, path, external_data, arrays)


def write_graph(model: onnx.ModelProto, path: Path, external_data: bool | None = None,
                arrays: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write ``model`` to ``path``: inline, or with every initializer of 1 KiB and more in
    ``<name>.data`` beside it, at offsets aligned to 4 KiB (see the module's note on
    ``external_data``). ``arrays``: the weights built apart (``onnx_build.weights_apart``),
    which the model holds as placeholders. A graph written with external data is checked by
    path, one built apart and written inline in memory (``onnx.checker``, full check; a
    graph with ONNX Runtime's contrib operators by neither)."""
    arrays = arrays or {}
    apart = [arrays[t.name] for t in model.graph.initializer if is_apart(t, arrays)]
    size = initializer_bytes(model) + sum(array.nbytes for array in apart)
    external = size > INLINE_LIMIT if external_data is None else bool(external_data)
    data = path.with_name(path.name + ".data")
    path.parent.mkdir(parents=True, exist_ok=True)
    data.unlink(missing_ok=True)  # a stale one from an earlier external write
    if not external:
        if size >= 1 << 31:
            raise ExportError(f"{path.name}: {size} bytes of weights do not fit in one "
                              "protobuf (2 GiB)", file=str(path),
                              remedy="write it with external_data=True (or None)")
        fill_inline(model, arrays)
        if apart and not uses_ort_operators(model):  # built apart: unchecked until now
            onnx.checker.check_model(model, full_check=True)
        return write_model(model, path)
    write_with_external_data(model, path, arrays)
    if not uses_ort_operators(model):  # the ONNX checker knows no ONNX Runtime contrib op
        onnx.checker.check_model(str(path), full_check=True)
    return path


def _rollback(rollback_positions: int | None, max_proposal_width: int) -> int:
    if not isinstance(max_proposal_width, int) or max_proposal_width < 1:
        raise ExportError("max_proposal_width must be an integer >= 1",
                          path="max_proposal_width", value=max_proposal_width)
    rollback = rollback_positions or max(DEFAULT_ROLLBACK, max_proposal_width)
    if rollback < max_proposal_width:
        raise ExportError("rollback_positions must be at least max_proposal_width",
                          path="rollback_positions", value=rollback,
                          expected=f">= {max_proposal_width}")
    return rollback


def _header(title: str, c: LlamaConfig, dtype: str) -> str:
    return (f"{title}, {dtype}. Written by speculant_tools.export: vocab {c.vocab_size}, hidden "
            f"{c.hidden_size}, {c.num_hidden_layers} layers,\n{c.num_attention_heads} heads x "
            f"{c.head_dim} ({c.num_key_value_heads} KV heads), intermediate "
            f"{c.intermediate_size}, context {c.max_position_embeddings}. Initializers carry "
            "the Hugging Face\nnames; `speculant export-hf` writes the checkpoint back out.")


def _copy_tokenizer(path: str | Path, root: Path) -> None:
    destination = root / "tokenizer.json"
    if Path(path).resolve() != destination.resolve():
        shutil.copyfile(path, destination)


def tokenizer_facts(path: str | Path, eos_id: int | None = None) -> TokenizerFacts:
    """``package.tokenizer`` facts of a ``tokenizer.json``; without ``eos_id``, the one added
    special token named like an EOS (``</s>``, ``<|endoftext|>``, ...)."""
    from tokenizers import Tokenizer

    path = Path(path)
    try:
        data = json.loads(path.read_text())
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # noqa: BLE001 (tokenizers raises a bare Exception)
        raise ExportError(f"cannot read the tokenizer: {error}", file=str(path)) from None
    if eos_id is None:
        found = [t["id"] for t in data.get("added_tokens", [])
                 if t.get("special") and t.get("content") in EOS_NAMES]
        if len(found) != 1:
            raise ExportError("cannot tell the EOS token from the tokenizer", file=str(path),
                              value=found, expected="one special token among "
                              + ", ".join(EOS_NAMES), remedy="pass eos_id")
        eos_id = found[0]
    content = tokenizer.id_to_token(eos_id)
    if content is None:
        raise ExportError("eos_id is not a token of the tokenizer", file=str(path),
                          value=eos_id)
    parts = json.dumps([data.get("pre_tokenizer"), data.get("decoder")])
    return TokenizerFacts(algorithm=str((data.get("model") or {}).get("type", "bpe")).lower(),
                          vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                          byte_level="ByteLevel" in parts, eos_id=int(eos_id),
                          eos_content=content)


# -- reading ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PackageSettings:
    """What a rebuild needs besides the weights, read from the metadata document."""

    dtype: str  # the package dtype (the target's logits port)
    is_pair: bool
    target_artifact: Path
    assistant_artifact: Path | None
    tokenizer: Path
    eos_id: int | None
    scale: float | None
    max_proposal_width: int | None
    rollback_positions: int
    cache: str = "appended"  # the caches' form: appended | static
    batch: int | None = None  # the rows of its batched pass (update.batch.max_rows), if any


def read_settings(package_root: str | Path) -> PackageSettings:
    from speculant.package.document import find_metadata, parse_text

    root = Path(package_root)
    path = find_metadata(root)
    doc = parse_text(path.read_text(), str(path), is_json=path.suffix == ".json")
    try:
        workflow = doc["pipeline"]["workflow"]
        components = workflow["components"]
        spec = doc.get("speculative")
        target = spec["target"] if spec else next(iter(components))
        groups = workflow["serving"]["state_service"]["groups"]
        rollback = min(g["capabilities"]["rollback_positions"] for g in groups.values())
        chain = spec["proposal_execution"] if spec else None
        eos = doc.get("package", {}).get("tokenizer", {}).get("special_tokens", {}).get("eos")
        return PackageSettings(
            dtype=components[target]["ports"]["outputs"]["logits"]["dtype"],
            is_pair=spec is not None,
            target_artifact=_artifact(root, components[target]),
            assistant_artifact=_artifact(root, components[spec["proposer"]]) if spec else None,
            tokenizer=root / "tokenizer.json", eos_id=eos["id"] if eos else None,
            scale=chain["token_embedding"].get("scale") if chain else None,
            max_proposal_width=spec["max_proposal_width"] if spec else None,
            rollback_positions=rollback, cache=cache_form(doc), batch=batch_rows(doc))
    except (KeyError, TypeError, StopIteration) as error:
        raise ExportError(f"not a package written by speculant_tools.export (no {error})",
                          file=str(path)) from None


def _artifact(root: Path, component: Mapping[str, Any]) -> Path:
    artifact = component["implementation"]["artifact"]
    if Path(artifact).is_absolute() or ".." in Path(artifact).parts:
        raise ExportError("artifact path leaves the package", value=artifact)
    return root / artifact


def _initializers(path: Path) -> tuple[LlamaConfig | None, dict[str, onnx.TensorProto], bool]:
    """The graph's config, its initializers by name, and whether it has int4 linear layers
    (MatMulNBits: ``--quantize-drafter``)."""
    try:
        model = onnx.load(str(path))
    except (OSError, DecodeError) as error:
        raise ExportError(f"cannot read the model: {error}", file=str(path)) from None
    props = {p.key: p.value for p in model.metadata_props}
    config = LlamaConfig.from_json(props[CONFIG_KEY]) if CONFIG_KEY in props else None
    return (config, {t.name: t for t in model.graph.initializer},
            any(node.op_type == "MatMulNBits" for node in model.graph.node))


def _arrays(tensors: Mapping[str, onnx.TensorProto], names: list[str],
            path: Path) -> dict[str, np.ndarray]:
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ExportError(f"the model lacks the weights {', '.join(missing)}", file=str(path))
    return {name: numpy_helper.to_array(tensors[name]) for name in names}


def read_weights(package_root: str | Path, *, skip_int4_drafter: bool = False
                 ) -> tuple[LlamaConfig, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """``(config, target_weights, drafter_weights)`` from the graphs' initializers, exactly
    as written (the package dtype). ``drafter_weights`` is None for a decoder package. An
    int4 drafter (``--quantize-drafter``) has no float weights to read: an ExportError with
    the remedy (``skip_int4_drafter``: None for it instead). The drafter's widths (its MLP,
    its LM head's rows) are read from its own graph, so a drafter retrained at another width
    and put beside an unchanged target reads back as written."""
    settings = read_settings(package_root)
    config, target_tensors, _ = _initializers(settings.target_artifact)
    if config is None:
        raise ExportError(f"the model has no {CONFIG_KEY} metadata (not written by "
                          "speculant_tools.export)", file=str(settings.target_artifact))
    target = _arrays(target_tensors, list(target_shapes(config)), settings.target_artifact)
    if settings.assistant_artifact is None:
        return config, target, None
    own, tensors, is_int4 = _initializers(settings.assistant_artifact)
    if own is not None:  # the drafter's widths are its graph's (a retrained drafter may differ)
        config = replace(config, drafter_intermediate_size=own.drafter_intermediate_size,
                         draft_vocab_size=own.draft_vocab_size)
    if is_int4 and skip_int4_drafter:
        return config, target, None
    if is_int4:
        raise ExportError("the drafter's linear layers are int4 (MatMulNBits): its float "
                          "weights are not in the package", file=str(settings.assistant_artifact),
                          remedy="convert or scale the float package, then quantize the "
                                 "result's drafter (--quantize-drafter int4)")
    fusion = list(seed_fusion_shapes(config))  # the drafter's, in the target's graph
    names = [name for name in drafter_shapes(config) if name not in fusion]
    drafter = _arrays(tensors, [EMBEDDING, *names], settings.assistant_artifact)
    if not np.array_equal(drafter.pop(EMBEDDING), target[EMBEDDING][:config.draft_vocab_size]):
        raise ExportError(f"the drafter's {EMBEDDING} (its tied LM head) differs from the "
                          f"target's first {config.draft_vocab_size} rows",
                          file=str(settings.assistant_artifact))
    drafter.update(_arrays(target_tensors, fusion, settings.target_artifact))
    return config, target, drafter


def convert(package_root: str | Path, out_root: str | Path, dtype: str = "float16", *,
            external_data: bool | None = None, graph: str = "auto",
            cache: str | None = None, quantize_drafter: str | None = None,
            batch: int | None = None) -> Path:
    """Rebuild a package written by this module in ``dtype`` (the chain's currency: table,
    carry and fused port follow it) and ``cache`` form (None: the source's). Scale, widths,
    EOS and tokenizer are kept. ``quantize_drafter="int4"``: the drafter's linear layers as
    MatMulNBits (:func:`~speculant_tools.importers.int4.quantize_drafter`). ``batch``: the
    rows of the batched pass (None: the source's where the result's caches are static;
    docs/design/batching.md)."""
    from speculant_tools.importers.int4 import check_drafter_quantization
    from speculant_tools.importers.int4 import quantize_drafter as quantize

    dtype = check_dtype(dtype)
    source, out = Path(package_root), Path(out_root)
    if out.resolve() == source.resolve():
        raise ExportError("convert writes a new package; out_root is the package itself",
                          value=str(out))
    settings = read_settings(source)
    check_drafter_quantization(quantize_drafter, source, settings.assistant_artifact)
    cache = check_cache(settings.cache if cache is None else cache)
    batch = source_batch(batch, settings, cache)
    config, target, drafter = read_weights(source)
    if drafter is None:
        return write_decoder_package(out, target, config, settings.tokenizer, dtype=dtype,
                                     eos_id=settings.eos_id,
                                     rollback_positions=settings.rollback_positions,
                                     external_data=external_data, graph=graph, cache=cache,
                                     batch=batch)
    written = write_pair_package(out, target, config, drafter, settings.tokenizer,
                                 dtype=dtype, scale=settings.scale,
                                 max_proposal_width=settings.max_proposal_width or 8,
                                 eos_id=settings.eos_id,
                                 rollback_positions=settings.rollback_positions,
                                 external_data=external_data, graph=graph, cache=cache,
                                 batch=batch)
    quantize(written, quantize_drafter)
    return written


def source_batch(batch: int | None, settings: PackageSettings, cache: str) -> int | None:
    """The rows of a rebuilt package's batched pass: ``batch`` as asked (checked), else the
    source's where the rebuilt caches are static (an appended package has no batched pass)."""
    if batch is None:
        return settings.batch if cache == "static" else None
    check_batch_form(batch, cache)
    return batch
