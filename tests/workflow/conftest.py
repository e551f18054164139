"""Fixture packages for the workflow tests, written once per session into temporary folders.

``decoder_engine(dtype, fmt)`` and ``chained_engine(dtype)`` load (and cache) the hermetic
fixtures of ``builders``; ``edited_package(name, edit)`` writes a decoder package and
applies ``edit`` to its parsed ``inference_metadata.yaml`` (a one-edit variant); ``passes``
records what every target pass bound (runtime.md §4) while a test runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

import speculant
from builders.writers import write_chained_package, write_decoder_package
from speculant.session.session import ComponentSession
from speculant.workflow.target_pass import TargetPass


@pytest.fixture(scope="session")
def decoder_package(tmp_path_factory) -> Callable[..., Path]:
    """(dtype, fmt, **knobs) -> the written decoder package folder, written once."""
    root = tmp_path_factory.mktemp("workflow_decoders")
    written: dict[tuple, Path] = {}

    def get(dtype: str = "float32", fmt: str = "onnx", **knobs) -> Path:
        key = (dtype, fmt, tuple(sorted((k, repr(v)) for k, v in knobs.items())))
        if key not in written:
            folder = root / f"decoder{len(written)}_{dtype}_{fmt}"
            written[key] = write_decoder_package(folder, dtype=dtype, fmt=fmt, **knobs)
        return written[key]
    return get


@pytest.fixture(scope="session")
def decoder_engine(decoder_package) -> Callable[..., speculant.Engine]:
    """(dtype, fmt, **knobs) -> a loaded decoder engine, loaded once."""
    engines: dict[Path, speculant.Engine] = {}

    def get(dtype: str = "float32", fmt: str = "onnx", **knobs) -> speculant.Engine:
        path = decoder_package(dtype, fmt, **knobs)
        if path not in engines:
            engines[path] = speculant.load(path)
        return engines[path]
    return get


@pytest.fixture(scope="session")
def chained_engine(tmp_path_factory) -> Callable[[str], speculant.Engine]:
    root = tmp_path_factory.mktemp("workflow_chained")
    engines: dict[str, speculant.Engine] = {}

    def get(dtype: str = "float32") -> speculant.Engine:
        if dtype not in engines:
            engines[dtype] = speculant.load(write_chained_package(root / dtype, dtype=dtype))
        return engines[dtype]
    return get


@pytest.fixture(scope="session")
def edited_package(tmp_path_factory) -> Callable[[str, Callable[[dict], None]], Path]:
    """(name, edit) -> a float32 decoder package whose metadata ``edit`` changed in place."""
    root = tmp_path_factory.mktemp("workflow_variants")
    written: dict[str, Path] = {}

    def get(name: str, edit: Callable[[dict], None]) -> Path:
        if name not in written:
            folder = write_decoder_package(root / name)
            metadata = folder / "inference_metadata.yaml"
            document = yaml.safe_load(metadata.read_text())
            edit(document)
            metadata.write_text(yaml.safe_dump(document, sort_keys=False))
            written[name] = folder
        return written[name]
    return get


@dataclass
class RecordedPass:
    """One target pass: its tokens, its start C0 and host copies of every bound value."""

    tokens: tuple[int, ...]
    start: int
    values: dict[str, np.ndarray]  # workflow value name -> what the pass bound or produced
    port_inputs: dict[str, np.ndarray]  # target port -> what ComponentSession.invoke received


@pytest.fixture
def passes(monkeypatch) -> list[RecordedPass]:
    """Every target pass run while the test runs, in order (TargetPass.run and the target
    session's invoke are wrapped; the values are copied when they are bound)."""
    recorded: list[RecordedPass] = []
    invoked: list[dict[str, np.ndarray]] = []
    original_run, original_invoke = TargetPass.run, ComponentSession.invoke

    def run(self, tokens, start, cells, admitted, controls, **kwargs):
        invoked.clear()
        result = original_run(self, tokens, start, cells, admitted, controls, **kwargs)
        values = {name: np.array(value.data) for name, value in result.values.items()}
        ports = dict(invoked[0]) if invoked else {}
        recorded.append(RecordedPass(tuple(tokens), start, values, ports))
        return result

    def invoke(self, inputs, outputs=None, **options):
        invoked.append({port: np.array(value.data) for port, value in inputs.items()})
        return original_invoke(self, inputs, outputs, **options)

    monkeypatch.setattr(TargetPass, "run", run)
    monkeypatch.setattr(ComponentSession, "invoke", invoke)
    return recorded
