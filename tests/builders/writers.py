"""Write fixture packages to disk: metadata, graphs (``.onnx`` or ``.onnx.textproto``),
``tokenizer.json``.

    write_decoder_package(root, dtype="float32", fmt="onnx")          # metadata.md §8.1 style
    write_chained_package(root, dtype="float16", fmt="textproto")     # evidence.md §3 pair
    write_chained_package(root, variant="mixed_currency")             # refused at load (A7)
    write_chained_package(root, variant="in_circulation")             # fails rule 32
    write_chained_package(root, deviation_positions={3, 9})           # any FixtureSpec knob
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from builders import definition as fx
from builders.graphs import drafter_graph, target_graph
from builders.metadata import VOCABULARY_MAP, chained_metadata, decoder_metadata
from builders.tokenizer import build_tokenizer
from speculant_tools.writing import write_metadata, write_model

FORMATS = {"onnx": ".onnx", "textproto": ".onnx.textproto"}
DTYPES = ("float32", "float16")
VARIANTS = {
    None: {},
    # float32 fused port (currency) with a float16 embedding table: load must refuse (A7).
    "mixed_currency": {"table_dtype": "float16"},
    # how packages made for the reference system look: every sequence-like axis is
    # `sequence` (fails rule 32) and the drafter invoke binds the incoming request caches.
    "in_circulation": {"axis_style": "sequence", "borrowed_binding": "past"},
}


def write_tokenizer(root: Path) -> Path:
    path = root / "tokenizer.json"
    build_tokenizer().save(str(path))
    return path


def _check(dtype: str, fmt: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FORMATS)}, not {fmt!r}")
    return FORMATS[fmt]


def write_decoder_package(root: str | Path, *, dtype: str = "float32", fmt: str = "onnx",
                          spec: fx.FixtureSpec | None = None, rollback_positions: int = 4,
                          axis_style: str = "distinct", equivalence: str | None = None,
                          with_tokenizer: bool = True, **spec_knobs: Any) -> Path:
    """The tiny greedy decoder (component ``decoder``). ``spec_knobs`` build the
    :class:`FixtureSpec` when ``spec`` is not given (deviation_positions, margin,
    max_context)."""
    root = Path(root)
    suffix = _check(dtype, fmt)
    spec = spec or fx.make_spec(**spec_knobs)
    artifact = f"decoder/model{suffix}"
    write_model(target_graph(spec, dtype, with_hidden=False, name="decoder"), root / artifact)
    write_metadata(decoder_metadata(spec, dtype, artifact=artifact,
                                    rollback_positions=rollback_positions,
                                    axis_style=axis_style, equivalence=equivalence),
                   root, _header("Greedy decoder fixture", dtype, spec))
    if with_tokenizer:
        write_tokenizer(root)
    return root


def write_chained_package(root: str | Path, *, dtype: str = "float32",
                          fmt: str = "textproto", variant: str | None = None,
                          spec: fx.FixtureSpec | None = None, table_dtype: str | None = None,
                          axis_style: str = "distinct", borrowed_binding: str = "present",
                          declare_scale: bool = True, max_proposal_width: int = 4,
                          rollback_positions: int = 4, distribution_preserving: bool = True,
                          equivalence: str | None = None, with_tokenizer: bool = True,
                          **spec_knobs: Any) -> Path:
    """The chained pair (components ``target`` and ``assistant``). ``variant`` presets knobs
    (see :data:`VARIANTS`) and its presets win over the same knobs given explicitly."""
    root = Path(root)
    suffix = _check(dtype, fmt)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, not {variant!r}")
    preset = VARIANTS[variant]
    table_dtype = preset.get("table_dtype", table_dtype)
    axis_style = preset.get("axis_style", axis_style)
    borrowed_binding = preset.get("borrowed_binding", borrowed_binding)
    if variant == "mixed_currency" and dtype != "float32":
        raise ValueError("the mixed_currency variant has a float32 fused port")
    spec = spec or fx.make_spec(**spec_knobs)
    target_artifact, assistant_artifact = f"target/model{suffix}", f"assistant/model{suffix}"
    write_model(target_graph(spec, dtype, table_dtype=table_dtype), root / target_artifact)
    write_model(drafter_graph(spec, dtype), root / assistant_artifact)
    document = chained_metadata(
        spec, dtype, target_artifact=target_artifact, assistant_artifact=assistant_artifact,
        axis_style=axis_style, borrowed_binding=borrowed_binding, declare_scale=declare_scale,
        max_proposal_width=max_proposal_width, rollback_positions=rollback_positions,
        distribution_preserving=distribution_preserving, equivalence=equivalence)
    if spec.proposer_vocab_map is not None:
        np.asarray(spec.proposer_vocab_map, "<i8").tofile(root / VOCABULARY_MAP)
    title = "Chained pair fixture" + (f" (variant {variant})" if variant else "")
    write_metadata(document, root, _header(title, dtype, spec))
    if with_tokenizer:
        write_tokenizer(root)
    return root


def _header(title: str, dtype: str, spec: fx.FixtureSpec) -> str:
    positions = ", ".join(str(p) for p in sorted(spec.deviation_positions))
    return (f"{title}, {dtype}. Written by builders; the function is defined in\n"
            "speculant/fixtures/definition.py and mirrored in numpy by fixtures/reference.py.\n"
            f"Deviation positions: {positions}. Logit margin: {spec.margin}.")
