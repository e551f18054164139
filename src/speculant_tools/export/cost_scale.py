"""Cost-scaled targets: the trained pair's function at the cost of a ~100M or ~1B target.

    from speculant_tools.export.cost_scale import scale_target
    result = scale_target("src/speculant/demo", "scaled/demo-100m", params="100M")
    # speculant scale-target src/speculant/demo scaled/demo-100m --params 100M

A tiny trained target is launch-bound on a GPU and cheap on two CPU cores, so what
speculation saves never shows. The scaled target computes the trained target's function with
many more bytes to read per pass:

* **Wider MLPs.** Every layer's MLP grows from F to F' units: ``gate_proj`` and ``up_proj``
  get F' − F extra rows (random, like real weights: zeros can run faster than real data),
  ``down_proj`` F' − F extra columns of zeros, so the extra units add exactly 0.
* **Extra layers.** Layers inserted *before the trained last layer* have random q/k/v,
  gate/up and norm weights and zero ``o_proj`` and ``down_proj``: each adds exactly 0 to the
  residual stream (``x + 0 = x``) while doing a real layer's work, KV cache included. Every
  layer has its own KV cells (the package's ``rollback_state`` lists them all).
* **Unchanged:** the embedding (tied LM head), hidden size, heads, head_dim, KV heads,
  vocabulary, context, RoPE, the final norm and the trained layers' attention.

The chained drafter reads the last target layer's KV: the trained last layer stays last, so
the drafter's borrowed cells (``kv.{L-1}``) hold what it was trained on. The drafter's own
weights are copied unchanged (``drafter_intermediate_size`` keeps its trained width): it costs
what the trained drafter costs. The logits equal the trained target's up to floating-point
reassociation in the widened ``down_proj`` sums (more zero terms change the kernel's summing
order); :func:`check_identical` measures that and the greedy tokens.

``shape="realistic-1b"`` (:mod:`~speculant_tools.export.widen`) instead widens every
dimension to a real model's (hidden, heads, head size, layers, MLP), drafter included, with
zero padding that keeps the function; ``cache="static"`` writes the pair with static caches.

Scaled packages are generated on the machine that benchmarks them and never committed (the
repository ignores ``/scaled/``). A ``cost_scale.json`` in the package root records how it
was derived.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speculant_tools.export.config import EMBEDDING, ExportError, LlamaConfig, target_shapes
from speculant_tools.export.package import (
    check_cache,
    read_settings,
    read_weights,
    source_batch,
    write_pair_package,
)
from speculant_tools.export.widen import layer_order, widen_weights, widened_config

RECORD = "cost_scale.json"
MULTIPLE = 256  # the widened intermediate size is a multiple of this
# Layers of the scaled target by size: GPT-2 small (124M) has 12, Llama 3.2 1B has 16, so a
# pass launches about as many kernels as a real model of that size; the MLPs carry the bytes.
LAYERS_BELOW_500M, LAYERS_FROM_500M = 12, 16
PAIR_EXTRAS = ("val_prompts.json",)  # files beside the graphs that the bench reads


# -- sizes ----------------------------------------------------------------------------------
def parameter_count(config: LlamaConfig) -> int:
    """Parameters of the target (its Hugging Face weights; the RoPE tables are not counted):
    ``V·H + H + L·(2H + 2·H·Q + 2·H·K + 3·H·F)`` with ``Q = heads·head_dim``,
    ``K = kv_heads·head_dim``."""
    h, f = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = 2 * h + 2 * h * q + 2 * h * kv + 3 * h * f
    return config.vocab_size * h + h + config.num_hidden_layers * per_layer


def parse_params(params: str | int) -> int:
    """``100M``, ``1B``, ``250M``, ``1.5B``, ``2000000``: a parameter count."""
    if isinstance(params, int):
        count = params
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMbB]?)\s*", str(params))
        if found is None:
            raise ExportError("params must be a count such as 100M or 1B", path="params",
                              value=params)
        factor = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}[found[2].lower()]
        count = round(float(found[1]) * factor)
    if count < 1:
        raise ExportError("params must be positive", path="params", value=params)
    return count


def plan(config: LlamaConfig, params: str | int, num_layers: int | None = None,
         intermediate_size: int | None = None) -> LlamaConfig:
    """The scaled configuration: ``num_layers`` (default 12 below 500M parameters, 16 from
    500M; never fewer than the trained layers) and the intermediate size (default: the
    multiple of 256 that brings the parameter count nearest ``params``; never narrower than
    the trained MLPs)."""
    target = parse_params(params)
    layers = num_layers or max(config.num_hidden_layers, LAYERS_BELOW_500M
                               if target < 500_000_000 else LAYERS_FROM_500M)
    if layers < config.num_hidden_layers:
        raise ExportError("a cost-scaled target keeps every trained layer",
                          path="num_layers", value=layers,
                          expected=f">= {config.num_hidden_layers}")
    if intermediate_size is None:
        base = dataclasses.replace(config, num_hidden_layers=layers, intermediate_size=1,
                                   drafter_intermediate_size=config.drafter_intermediate_size)
        per_unit = 3 * config.hidden_size * layers  # parameters per intermediate unit
        units = (target - parameter_count(base)) / per_unit + 1
        intermediate_size = max(config.intermediate_size,
                                MULTIPLE * max(1, round(units / MULTIPLE)))
    if intermediate_size < config.intermediate_size:
        raise ExportError("the scaled MLPs cannot be narrower than the trained ones",
                          path="intermediate_size", value=intermediate_size,
                          expected=f">= {config.intermediate_size}")
    return dataclasses.replace(config, num_hidden_layers=layers,
                               intermediate_size=intermediate_size,
                               drafter_intermediate_size=config.drafter_intermediate_size)


# -- weights --------------------------------------------------------------------------------
def scale_weights(config: LlamaConfig, target: Mapping[str, np.ndarray], scaled: LlamaConfig,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """The scaled target's weights (in the trained weights' dtype): trained weights copied
    into the widened shapes with zero ``down_proj`` columns and random ``gate``/``up`` rows;
    added layers random with zero ``o_proj`` and ``down_proj``. Random values follow each
    weight kind's spread in the trained layers (normal with their mean and std)."""
    rng = np.random.default_rng(seed)
    dtype = target[EMBEDDING].dtype
    n, f, f2 = config.num_hidden_layers, config.intermediate_size, scaled.intermediate_size
    kinds = sorted({name.split(".", 3)[3] for name in target if name.startswith("model.layers.")})
    stats = {kind: _spread([target[f"model.layers.{i}.{kind}"] for i in range(n)])
             for kind in kinds}

    def draw(kind: str, shape: tuple[int, ...]) -> np.ndarray:
        mean, std = stats[kind]
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        values += np.float32(mean)
        return values.astype(dtype, copy=False)

    shapes = target_shapes(scaled)
    out = {EMBEDDING: target[EMBEDDING], "model.norm.weight": target["model.norm.weight"]}
    for j, source in enumerate(layer_order(n, scaled.num_hidden_layers)):
        for kind in kinds:
            name, shape = f"model.layers.{j}.{kind}", shapes[f"model.layers.{j}.{kind}"]
            if source is None:  # an added layer
                zero = kind in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
                out[name] = np.zeros(shape, dtype) if zero else draw(kind, shape)
                continue
            trained = target[f"model.layers.{source}.{kind}"]
            if kind in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                out[name] = np.concatenate([trained, draw(kind, (f2 - f, shape[1]))], axis=0)
            elif kind == "mlp.down_proj.weight":
                out[name] = np.concatenate([trained, np.zeros((shape[0], f2 - f), dtype)],
                                           axis=1)
            else:
                out[name] = trained
    return {name: out[name] for name in shapes}  # graph order


def _spread(arrays: list[np.ndarray]) -> tuple[float, float]:
    values = np.concatenate([a.astype(np.float32).ravel() for a in arrays])
    return float(values.mean()), float(values.std())


# -- the package ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleResult:
    root: Path
    config: LlamaConfig  # the scaled target's
    trained_config: LlamaConfig
    parameters: int  # target parameters
    trained_parameters: int
    layer_order: list[int | None]
    check: dict | None  # check_identical's figures, when run

    def record(self) -> dict:
        return {"trained_config": dataclasses.asdict(self.trained_config),
                "config": dataclasses.asdict(self.config),
                "target_parameters": self.parameters,
                "trained_target_parameters": self.trained_parameters,
                "layer_order": self.layer_order, "check": self.check}


def scale_target(package_root: str | Path, out_root: str | Path, params: str | int = "100M",
                 *, num_layers: int | None = None, intermediate_size: int | None = None,
                 seed: int = 0, external_data: bool | None = None,
                 check_tokens: int = 16, graph: str = "auto", shape: str | None = None,
                 cache: str | None = None, quantize_drafter: str | None = None,
                 batch: int | None = None) -> ScaleResult:
    """Write the cost-scaled pair of the chained pair at ``package_root`` into ``out_root``
    (same dtype, tokenizer, scale, widths and EOS; the trained drafter). ``shape``: a real
    model's shape (:data:`~speculant_tools.export.widen.SHAPES`; ``params``, ``num_layers``
    and ``intermediate_size`` are then not used); ``cache``: ``appended`` or ``static``
    (None: the source's); ``batch``: the rows of the batched pass (None: the source's where
    the caches are static; docs/design/batching.md). With ``check_tokens > 0``,
    :func:`check_identical` compares it with the trained pair on the CPU and raises
    :class:`ExportError` if the greedy tokens or the chained trace differ;
    ``quantize_drafter="int4"`` then quantizes the drafter
    (:func:`~speculant_tools.importers.int4.quantize_drafter`: after the check, whose trace
    is the float drafter's)."""
    from speculant_tools.importers.int4 import check_drafter_quantization
    from speculant_tools.importers.int4 import quantize_drafter as quantize

    source, out = Path(package_root), Path(out_root)
    if out.resolve() == source.resolve():
        raise ExportError("scale-target writes a new package; out_root is the package itself",
                          value=str(out))
    settings = read_settings(source)
    check_drafter_quantization(quantize_drafter, source, settings.assistant_artifact)
    cache = check_cache(settings.cache if cache is None else cache)
    batch = source_batch(batch, settings, cache)
    config, target, drafter = read_weights(source)
    if drafter is None:
        raise ExportError("scale-target needs a chained pair (target + drafter)",
                          file=str(source), expected="a package written by write_pair_package")
    if shape is None:
        scaled = plan(config, params, num_layers, intermediate_size)
        weights = scale_weights(config, target, scaled, seed)
    else:
        scaled = widened_config(config, shape)
        weights, drafter = widen_weights(config, target, drafter, scaled, seed)
    del target
    write_pair_package(out, weights, scaled, drafter, settings.tokenizer, dtype=settings.dtype,
                       scale=settings.scale,
                       max_proposal_width=settings.max_proposal_width or 8,
                       eos_id=settings.eos_id, rollback_positions=settings.rollback_positions,
                       external_data=external_data, graph=graph, cache=cache, batch=batch)
    del weights
    for name in PAIR_EXTRAS:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    check = check_identical(source, out, check_tokens) if check_tokens > 0 else None
    result = ScaleResult(out, scaled, config, parameter_count(scaled), parameter_count(config),
                         layer_order(config.num_hidden_layers, scaled.num_hidden_layers), check)
    (out / RECORD).write_text(json.dumps({"source": str(source), "params": str(params),
                                          "shape": shape, "cache": read_settings(out).cache,
                                          "batch": batch,
                                          "seed": seed, "quantize_drafter": quantize_drafter,
                                          **result.record()},
                                         indent=2) + "\n")
    if check is not None and not (check["greedy_equal"]
                                  and check["chained_trace_equal"] is not False):
        raise ExportError("the cost-scaled pair decodes differently from the trained pair",
                          file=str(out / RECORD), value=check)
    quantize(out, quantize_drafter)
    return result


# -- the check ------------------------------------------------------------------------------
def prefill_logits(package_root: str | Path, token_ids: list[int]) -> np.ndarray:
    """The target's logits ``[len(token_ids), vocab]`` of one prefill (empty cache) on the
    CPU, straight through ONNX Runtime, as float32 (either cache form)."""
    return _Prefill(package_root)(token_ids)


class _Prefill:
    """One CPU session of a package's target; calling it runs a prefill from empty caches
    (static form: buffers of capacity ``len(token_ids)``, length 0)."""

    def __init__(self, package_root: str | Path) -> None:
        import onnxruntime as ort

        from speculant.session.session import session_options

        settings = read_settings(package_root)
        self.session = ort.InferenceSession(str(settings.target_artifact), session_options(),
                                            providers=["CPUExecutionProvider"])
        self.dtype = {"float32": np.float32, "float16": np.float16}[settings.dtype]
        self.is_static = settings.cache == "static"

    def __call__(self, token_ids: list[int]) -> np.ndarray:
        ids = np.asarray([token_ids], dtype=np.int64)
        feeds = {"input_ids": ids,
                 "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None]}
        if self.is_static:
            feeds["cache_lengths"] = np.zeros(1, np.int64)
        else:
            feeds["attention_mask"] = np.ones_like(ids)
        extent = ids.shape[1] if self.is_static else 0
        for port in self.session.get_inputs():
            if port.name.startswith("past_key_values."):
                feeds[port.name] = np.zeros((1, port.shape[1], extent, port.shape[3]),
                                            self.dtype)
        return self.session.run(["logits"], feeds)[0][0].astype(np.float32)

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        """Greedy tokens by full recompute (one prefill per token)."""
        ids = list(prompt)
        for _ in range(new_tokens):
            ids.append(int(np.argmax(self(ids)[-1])))
        return ids[len(prompt):]


def check_identical(trained_root: str | Path, scaled_root: str | Path,
                    new_tokens: int = 16, prompt: list[int] | None = None) -> dict:
    """Compare a scaled pair with its trained pair on the CPU: max |Δ| of the prefill logits
    over ``prompt`` (default: the first validation prompt, else token ids 1..32), the greedy
    tokens of a ``new_tokens`` decode, and the chained proposer's trace (accepted length per
    round) at the package's widest k. Returns the figures; raises nothing."""
    import speculant

    prompt = list(prompt or _first_prompt(Path(trained_root)))
    reference = prefill_logits(trained_root, prompt)
    scaled = prefill_logits(scaled_root, prompt)
    delta = np.abs(reference - scaled)
    figures = {"prompt_tokens": len(prompt), "max_abs_logit_diff": float(delta.max()),
               "max_abs_logit": float(np.abs(reference).max()),
               "prefill_argmax_equal": bool((reference.argmax(-1) == scaled.argmax(-1)).all()),
               "new_tokens": new_tokens}
    if "static" in (read_settings(trained_root).cache, read_settings(scaled_root).cache):
        # speculant's runtime does not drive static caches yet: greedy by full recompute
        trained_greedy, scaled_greedy = (_Prefill(root).greedy(prompt, new_tokens)
                                         for root in (trained_root, scaled_root))
        figures.update({"greedy_equal": trained_greedy == scaled_greedy,
                        "chained_equals_greedy": None, "chained_trace_equal": None,
                        "chained_k": None, "chained_mean_accepted_length": None,
                        "note": "static caches: greedy by full recompute in ONNX Runtime; "
                                "the chained trace is not checked"})
        return figures
    traces = {}
    for name, root in (("trained", trained_root), ("scaled", scaled_root)):
        engine = speculant.load(root, threads=1)
        k = engine.package.document.speculative.max_proposal_width
        greedy = engine.generate(prompt, new_tokens, stop_on_eos=False).token_ids
        chained = engine.generate(prompt, new_tokens, stop_on_eos=False, speculative=True,
                                  k=k)
        traces[name] = (greedy, chained.token_ids, chained.stats.trace,
                        chained.stats.mean_accepted_length)
        del engine
    trained, scaled_run = traces["trained"], traces["scaled"]
    figures.update({
        "greedy_equal": trained[0] == scaled_run[0],
        "chained_equals_greedy": scaled_run[1] == scaled_run[0],
        "chained_trace_equal": trained[2] == scaled_run[2],
        "chained_k": k,
        "chained_mean_accepted_length": scaled_run[3]})
    return figures


def _first_prompt(root: Path) -> list[int]:
    path = root / "val_prompts.json"
    if path.is_file():
        data = json.loads(path.read_text())
        items = data["prompts"] if isinstance(data, dict) else data
        first = items[0]["prompt"] if isinstance(items[0], dict) else items[0]
        if isinstance(first, list) and first:
            return list(first)
    return list(range(1, 33))


def describe(result: ScaleResult) -> str:
    """A few lines for the command line."""
    c = result.config
    lines = [f"wrote {result.root}: {result.parameters:,} target parameters "
             f"({result.trained_parameters:,} trained; {c.num_hidden_layers} layers, "
             f"intermediate {c.intermediate_size}, hidden {c.hidden_size}, "
             f"{c.num_attention_heads} heads x {c.head_dim}, {c.num_key_value_heads} KV heads)",
             "layer sources (trained index, or - for an added layer): "
             + " ".join("-" if s is None else str(s) for s in result.layer_order)]
    check = result.check
    if check is not None:
        lines.append(f"check: max |logit diff| {check['max_abs_logit_diff']:.3g} over "
                     f"{check['prompt_tokens']} prompt tokens (max |logit| "
                     f"{check['max_abs_logit']:.3g}); greedy tokens equal: "
                     f"{check['greedy_equal']}" + (
                         f"; chained k={check['chained_k']} trace equal: "
                         f"{check['chained_trace_equal']} (mean accepted length "
                         f"{check['chained_mean_accepted_length']:.2f})"
                         if check["chained_k"] is not None else f" ({check['note']})"))
    return "\n".join(lines)


__all__ = ["ScaleResult", "check_identical", "describe", "layer_order",
           "parameter_count", "parse_params", "plan", "prefill_logits", "scale_target",
           "scale_weights"]
