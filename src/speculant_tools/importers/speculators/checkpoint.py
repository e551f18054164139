"""Read a speculators checkpoint (vllm-project/speculators' format) into an :class:`EagleHead`.

The folder holds ``config.json`` and ``*.safetensors``. ``config.json`` names the algorithm in
``speculators_model_type`` and carries ``speculators_config`` (``algorithm``,
``proposal_methods``, ``default_proposal_method``, ``verifier``) and
``transformer_layer_config`` (a Hugging Face decoder-layer config). Read here:

``eagle`` (EAGLE-1 / HASS; speculators' ``EagleSpeculator``): ``layernorms``, ``fusion_bias``;
weights ``fusion_fc.weight`` [H, 2H] (``fusion_fc.bias`` [H] with ``fusion_bias``),
``transformer.*`` (one Llama decoder layer; ``transformer.input_layernorm.weight``,
``embedding_layernorm.weight`` and ``pre_lm_head_layernorm.weight`` only with ``layernorms``);
the LM head and the embeddings are the verifier's.

``eagle3`` (``Eagle3DraftModel``): ``draft_vocab_size``, ``target_hidden_size``,
``eagle_aux_hidden_state_layer_ids``, ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``,
``norm_output``; weights ``fc.weight`` [H, n_aux * H] (``input_norm.weight`` with
``norm_before_fc``, ``fc_norm.{i}.weight`` with ``fc_norm``), ``layers.0.*`` (the first layer:
``hidden_norm.weight`` and q/k/v projections over ``2H``), ``norm.weight``, ``lm_head.weight``
[V_q, H], and ``d2t`` [V_q] int64 (target id = draft id + ``d2t[draft id]``) with ``t2d`` [V]
bool where ``V_q < V``; ``embed_tokens.weight``, where saved, must be the verifier's.

The safetensors files are read here (header, then raw little-endian bytes; BF16 through
ml_dtypes), so the importer needs neither torch nor the speculators package. Every refusal is
an :class:`ImporterError` naming the file, the field and the value.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from speculant_tools.export import ExportError, LlamaConfig
from speculant_tools.importers.checkpoint import ImporterError

ALGORITHMS = ("eagle", "eagle3")
LAYER_TYPES = ("llama",)
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
          "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}
LAYER = {"eagle": "transformer", "eagle3": "layers.0"}  # the decoder layer's weight prefix
DEFAULT_WIDTH = 5  # max_proposal_width where proposal_methods give no speculative_tokens


@dataclass(frozen=True)
class EagleHead:
    """An EAGLE-1 or EAGLE-3 head, its weights under speculators' names (float32; ``d2t``
    int64, ``t2d`` bool)."""

    algorithm: str  # eagle | eagle3
    layer: LlamaConfig  # the decoder layer's sizes (vocab_size: the verifier's)
    weights: dict[str, np.ndarray]
    speculative_tokens: int  # the default proposal method's drafts per round
    verifier: str  # speculators_config.verifier.name_or_path, for messages
    flags: dict[str, bool] = field(default_factory=dict)  # layernorms, fusion_bias, norm_*
    aux_layer_ids: tuple[int, ...] | None = None  # eagle3: None = [2, N // 2, N - 3]
    draft_vocab_size: int | None = None  # eagle3: V_q (None: the verifier's V)
    source: str = ""

    @property
    def prefix(self) -> str:
        return LAYER[self.algorithm]

    def draft_to_target(self) -> np.ndarray | None:
        """[V_q] int64 target ids, or None where the head scores the whole vocabulary."""
        d2t = self.weights.get("d2t")
        return None if d2t is None else np.arange(d2t.size, dtype=np.int64) + d2t


def is_speculators_folder(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return "speculators_config" in json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def read_speculators(folder: str | Path) -> EagleHead:
    """The EAGLE head saved in ``folder`` (see the module for what is read)."""
    folder = Path(folder)
    config_file = folder / "config.json"
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ImporterError(f"cannot read the JSON: {error}", file=str(config_file)) from None
    file = str(config_file)
    algorithm = data.get("speculators_model_type")
    if algorithm not in ALGORITHMS:
        raise ImporterError(
            "this speculators algorithm does not map onto a chained drafter", file=file,
            path="speculators_model_type", value=algorithm, expected=" or ".join(ALGORITHMS),
            remedy="peagle, dflash and dspark draft a block in one pass and mtp heads "
                   "chain their own hidden states: none is one step of concat(embedding, "
                   "carry)")
    layer_config = _layer_config(data, file)
    spec_config = data.get("speculators_config") or {}
    methods = spec_config.get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    flags = {key: bool(data.get(key, False)) for key in (
        ("layernorms", "fusion_bias") if algorithm == "eagle" else
        ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))}
    aux = data.get("eagle_aux_hidden_state_layer_ids")
    target_hidden = data.get("target_hidden_size")
    if algorithm == "eagle3" and target_hidden not in (None, layer_config.hidden_size):
        raise ImporterError("the verifier's hidden width differs from the head's: the head's "
                            "first layer takes the verifier's embedding beside its own "
                            "hidden state, so the two widths must agree", file=file,
                            path="target_hidden_size", value=target_hidden,
                            expected=str(layer_config.hidden_size))
    draft_vocab = data.get("draft_vocab_size") if algorithm == "eagle3" else None
    head = EagleHead(algorithm=algorithm, layer=layer_config,
                     weights=read_safetensors(folder), flags=flags,
                     speculative_tokens=int(tokens or DEFAULT_WIDTH),
                     verifier=str((spec_config.get("verifier") or {}).get("name_or_path")),
                     aux_layer_ids=tuple(aux) if aux else None,
                     draft_vocab_size=draft_vocab, source=str(folder))
    check_weights(head, file)
    return head


def _layer_config(data: dict[str, Any], file: str) -> LlamaConfig:
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ImporterError("config.json has no transformer_layer_config", file=file,
                            path="transformer_layer_config", expected="a decoder-layer config")
    model_type = layer.get("model_type", "llama")
    if model_type not in LAYER_TYPES:
        raise ImporterError("the head's decoder layer is not a Llama layer", file=file,
                            path="transformer_layer_config.model_type", value=model_type,
                            expected=" or ".join(LAYER_TYPES),
                            remedy="speculant's graphs hold Llama layers (a Qwen3 layer adds "
                                   "q/k norms)")
    if layer.get("num_hidden_layers", 1) != 1:
        raise ImporterError("the head has several decoder layers: the verifier's pass would "
                            "have to run the first one whole to give the second its context",
                            file=file, path="transformer_layer_config.num_hidden_layers",
                            value=layer.get("num_hidden_layers"), expected="1")
    try:
        config = LlamaConfig.from_hf({**layer, "tie_word_embeddings": True})  # ties nothing
    except ExportError as error:
        problem = error.problems[0]
        raise ImporterError(problem.message, file=file, value=problem.value,
                            path="transformer_layer_config" + problem.path.removeprefix(
                                "config"), expected=problem.expected) from None
    for name, value in config.variant_fields.items():  # the EAGLE graph's layer is plain
        raise ImporterError("the head's layer declares what speculant's EAGLE graph does not "
                            "compute", file=file, path=f"transformer_layer_config.{name}",
                            value=value, expected="a plain Llama layer (no biases, q/k "
                            "norms, RoPE scaling or sliding window)")
    return config


def read_safetensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of ``folder/*.safetensors``: floating point as float32, the rest as
    stored."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ImporterError("the checkpoint folder has no *.safetensors file", file=str(folder),
                            remedy="save the speculator with save_pretrained")
    weights: dict[str, np.ndarray] = {}
    for path in files:
        data = path.read_bytes()
        try:
            (size,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8:8 + size])
        except (struct.error, ValueError) as error:
            raise ImporterError(f"not a safetensors file: {error}", file=str(path)) from None
        body = memoryview(data)[8 + size:]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info.get("dtype") not in DTYPES:
                raise ImporterError("unsupported tensor type", file=str(path), path=name,
                                    value=info.get("dtype"), expected=", ".join(DTYPES))
            begin, end = info["data_offsets"]
            array = np.frombuffer(body[begin:end], DTYPES[info["dtype"]]).reshape(info["shape"])
            weights[name] = array.astype(np.float32) if array.dtype.kind == "f" or \
                info["dtype"] == "BF16" else array.copy()
    return weights


def expected_shapes(head: EagleHead) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight the head must have (optional ones by its flags)."""
    c, p = head.layer, head.prefix
    h, q, kv, f = c.hidden_size, c.num_attention_heads * c.head_dim, \
        c.num_key_value_heads * c.head_dim, c.intermediate_size
    width = 2 * h if head.algorithm == "eagle3" else h  # q/k/v's input
    shapes = {f"{p}.self_attn.q_proj.weight": (q, width),
              f"{p}.self_attn.k_proj.weight": (kv, width),
              f"{p}.self_attn.v_proj.weight": (kv, width),
              f"{p}.self_attn.o_proj.weight": (h, q),
              f"{p}.post_attention_layernorm.weight": (h,),
              f"{p}.mlp.gate_proj.weight": (f, h), f"{p}.mlp.up_proj.weight": (f, h),
              f"{p}.mlp.down_proj.weight": (h, f)}
    flags = head.flags
    if head.algorithm == "eagle":
        shapes["fusion_fc.weight"] = (h, 2 * h)
        if flags["fusion_bias"]:
            shapes["fusion_fc.bias"] = (h,)
        if flags["layernorms"]:
            for name in ("embedding_layernorm", "pre_lm_head_layernorm", f"{p}.input_layernorm"):
                shapes[f"{name}.weight"] = (h,)
        return shapes
    num_aux = len(head.aux_layer_ids or (0, 0, 0))
    vocab = head.draft_vocab_size or c.vocab_size
    shapes.update({"fc.weight": (h, num_aux * h), f"{p}.hidden_norm.weight": (h,),
                   f"{p}.input_layernorm.weight": (h,), "norm.weight": (h,),
                   "lm_head.weight": (vocab, h)})
    if vocab < c.vocab_size:
        shapes.update({"d2t": (vocab,), "t2d": (c.vocab_size,)})
    if flags["norm_before_fc"]:
        shapes["input_norm.weight"] = (num_aux * h,)
    if flags["fc_norm"]:
        shapes.update({f"fc_norm.{i}.weight": (h,) for i in range(num_aux)})
    return shapes


IGNORED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight",
           "verifier_norm.weight", "d2t", "t2d")  # checked against the verifier, or unused


def check_weights(head: EagleHead, file: str) -> None:
    """Every expected weight present with its shape; nothing unexpected; a consistent
    vocabulary map."""
    shapes = expected_shapes(head)
    weights = head.weights
    missing = [name for name in shapes if name not in weights]
    unexpected = sorted(name for name in weights if name not in shapes and name not in IGNORED)
    misshapen = [f"{name} {weights[name].shape} (expected {shape})"
                 for name, shape in shapes.items()
                 if name in weights and weights[name].shape != shape]
    problems = [f"missing {', '.join(missing)}"] if missing else []
    problems += [f"unexpected {', '.join(unexpected)}"] if unexpected else []
    problems += [f"shape of {', '.join(misshapen)}"] if misshapen else []
    if problems:
        raise ImporterError(f"the {head.algorithm} weights do not match config.json: "
                            + "; ".join(problems), file=str(head.source), path="weights",
                            remedy="check speculators_model_type and the norm flags")
    ids = head.draft_to_target()
    if ids is None:
        return
    vocab = head.layer.vocab_size
    if ids.min() < 0 or ids.max() >= vocab or np.unique(ids).size < ids.size:
        raise ImporterError("d2t maps draft ids outside the verifier's vocabulary or two onto "
                            "one target id", file=str(head.source), path="d2t",
                            value=ids.tolist()[:16],
                            expected=f"{ids.size} distinct target ids in [0, {vocab})")
    t2d = weights["t2d"].astype(bool)
    if np.flatnonzero(t2d).tolist() != sorted(ids.tolist()):
        raise ImporterError("t2d does not mark exactly the target ids d2t maps to",
                            file=str(head.source), path="t2d", value=int(t2d.sum()),
                            expected=f"{ids.size} marked ids: arange(V_q) + d2t")
