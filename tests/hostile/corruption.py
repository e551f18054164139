"""A package-corruption corpus built in code (review §2): each case is a copy of the tiny
greedy decoder package (binary ``.onnx``) with one corruption, written by a function of the
folder. ``CASES`` maps a case name to that function; every case must be refused by
``speculant inspect`` and ``speculant generate`` with exit 2 and one line on stderr."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from hostile_helpers import billion_laughs, laughs
from onnx import TensorProto, numpy_helper

MODEL = "decoder/model.onnx"
METADATA = "inference_metadata.yaml"


def _outside(root: Path) -> Path:
    """A folder beside the package (outside it), for escaping symlinks and locations."""
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir(exist_ok=True)
    return outside


def _bytes(root: Path, name: str) -> bytes:
    return (root / name).read_bytes()


def _edit_graph(edit: Callable[[onnx.ModelProto], None]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        model = onnx.load(str(root / MODEL))
        edit(model)
        onnx.save(model, str(root / MODEL))
    return corrupt


def _edit_metadata(old: str, new: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        path = root / METADATA
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return corrupt


def _value_info(model: onnx.ModelProto, name: str) -> onnx.ValueInfoProto:
    return next(v for v in [*model.graph.input, *model.graph.output] if v.name == name)


def _set_dtype(model: onnx.ModelProto) -> None:
    _value_info(model, "input_ids").type.tensor_type.elem_type = TensorProto.INT32


def _drop_axis(model: onnx.ModelProto) -> None:
    del _value_info(model, "logits").type.tensor_type.shape.dim[-1]


def _fix_last_axis(model: onnx.ModelProto) -> None:
    _value_info(model, "logits").type.tensor_type.shape.dim[-1].dim_value = 31


def _absurd_dim(model: onnx.ModelProto) -> None:
    _value_info(model, "logits").type.tensor_type.shape.dim[-1].dim_value = 2 ** 40


def _rename_input(model: onnx.ModelProto) -> None:
    info = _value_info(model, "input_ids")
    for node in model.graph.node:
        node.input[:] = ["ids" if name == "input_ids" else name for name in node.input]
    info.name = "ids"


def _unknown_op(model: onnx.ModelProto) -> None:
    model.graph.node[0].op_type = "NoSuchOp"


def _ir_version(model: onnx.ModelProto) -> None:
    model.ir_version = 99


def _truncate(name: str, keep: Callable[[int], int]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        data = _bytes(root, name)
        (root / name).write_bytes(data[: keep(len(data))])
    return corrupt


def _random_bytes(name: str, size: int | None = None) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        rng = random.Random(15)
        count = size or len(_bytes(root, name))
        (root / name).write_bytes(bytes(rng.randrange(256) for _ in range(count)))
    return corrupt


def _replace_text(name: str, text: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        (root / name).write_text(text)
    return corrupt


def _symlink_outside(name: str) -> Callable[[Path], None]:
    """``name`` (a file or folder) moved beside the package and linked back."""
    def corrupt(root: Path) -> None:
        target = _outside(root) / Path(name).name
        shutil.move(str(root / name), str(target))
        (root / name).symlink_to(target)
    return corrupt


def _replace_by_dir(name: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        (root / name).unlink()
        (root / name).mkdir()
    return corrupt


def _fifo(name: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        (root / name).unlink()
        os.mkfifo(root / name)
    return corrupt


def _small_tokenizer(root: Path) -> None:
    from test_hostile_load_checks import small_tokenizer
    small_tokenizer(20).save(str(root / "tokenizer.json"))


# -- external data ------------------------------------------------------------------------
DATA = "model.onnx.data"


def _externalize(root: Path) -> onnx.ModelProto:
    """Move every initializer of the model to ``decoder/model.onnx.data``."""
    model = onnx.load(str(root / MODEL))
    for tensor in model.graph.initializer:  # externalizing needs raw_data
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
    onnx.save(model, str(root / MODEL), save_as_external_data=True, location=DATA,
              all_tensors_to_one_file=True, size_threshold=0)
    return onnx.load(str(root / MODEL), load_external_data=False)


def _folded_bias_with_huge_length(root: Path) -> None:
    """A logits bias ``a + b`` of two external initializers, which ONNX Runtime folds while it
    initializes the session, ``a`` claiming 2**40 bytes: the refusal comes from the optimizer,
    which logs it itself before raising."""
    model = onnx.load(str(root / MODEL))
    last = next(n for n in model.graph.node if list(n.output) == ["logits"])
    last.output[0] = "logits_unbiased"
    width = _value_info(model, "logits").type.tensor_type.shape.dim[-1].dim_value
    model.graph.initializer.extend(numpy_helper.from_array(np.zeros(width, np.float32), name)
                                   for name in ("bias_a", "bias_b"))
    model.graph.node.extend([onnx.helper.make_node("Add", ["bias_a", "bias_b"], ["bias"]),
                             onnx.helper.make_node("Add", ["logits_unbiased", "bias"],
                                                   ["logits"])])
    onnx.save(model, str(root / MODEL), save_as_external_data=True, location=DATA,
              all_tensors_to_one_file=True, size_threshold=4 * width)  # the shape constants stay
    model = onnx.load(str(root / MODEL), load_external_data=False)
    bias_a = next(t for t in model.graph.initializer if t.name == "bias_a")
    next(e for e in bias_a.external_data if e.key == "length").value = str(2 ** 40)
    onnx.save(model, str(root / MODEL))


def _set_external(key: str, value: Callable[[Path], str]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        model = _externalize(root)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == key:
                    entry.value = value(root)
        onnx.save(model, str(root / MODEL))
    return corrupt


def _external_then(corrupt_data: Callable[[Path], None]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        _externalize(root)
        corrupt_data(root)
    return corrupt


def _external_elsewhere(root: Path) -> str:
    shutil.copy(root / "decoder" / DATA, _outside(root) / DATA)
    return f"../../{_outside(root).name}/{DATA}"


def _external_absolute(root: Path) -> str:
    shutil.copy(root / "decoder" / DATA, _outside(root) / DATA)
    return str(_outside(root) / DATA)


def _deep_json(root: Path) -> None:
    (root / METADATA).unlink()
    (root / "inference_metadata.json").write_text('{"a": ' + "[" * 1000 + "]" * 1000 + "}")


def _surrogate_json(root: Path) -> None:
    (root / METADATA).unlink()
    (root / "inference_metadata.json").write_text('{"schema_version": "\\ud800"}')


def _bomb_in_effects(root: Path) -> None:
    text = (root / METADATA).read_text().replace("  workflow:\n", "  workflow:\n    effects: *l9\n",
                                                 1)
    (root / METADATA).write_text(f"quantization: {laughs(9)}\n" + text)


CASES: dict[str, Callable[[Path], None]] = {
    "model_truncated_half": _truncate(MODEL, lambda n: n // 2),
    "model_truncated_header": _truncate(MODEL, lambda n: 100),
    "model_empty": _truncate(MODEL, lambda n: 0),
    "model_random_bytes": _random_bytes(MODEL),
    "model_random_small": _random_bytes(MODEL, 64),
    "graph_port_dtype": _edit_graph(_set_dtype),
    "graph_port_rank": _edit_graph(_drop_axis),
    "graph_port_fixed_dim": _edit_graph(_fix_last_axis),
    "graph_absurd_dim": _edit_graph(_absurd_dim),
    "graph_missing_port": _edit_graph(_rename_input),
    "graph_unknown_op": _edit_graph(_unknown_op),
    "graph_ir_version_99": _edit_graph(_ir_version),
    "meta_absurd_dim": _edit_metadata("shape: [batch, sequence, 32]", "shape: [batch, sequence, "
                                      "1000000000000]"),
    "meta_eos_out_of_vocab": _edit_metadata("eos: {id: 1,", "eos: {id: 99999,"),
    "meta_missing": lambda root: (root / METADATA).unlink(),
    "meta_is_dir": _replace_by_dir(METADATA),
    "meta_symlink_outside": _symlink_outside(METADATA),
    "meta_billion_laughs": _replace_text(METADATA, billion_laughs()),
    "meta_bomb_in_effects": _bomb_in_effects,
    "meta_deep_json": _deep_json,
    "meta_lone_surrogate_json": _surrogate_json,
    "meta_invalid_utf8": lambda root: (root / METADATA).write_bytes(b"schema_version: \xff\n"),
    "artifact_dotdot": _edit_metadata("artifact: decoder/model.onnx", "artifact: ../x/model.onnx"),
    "artifact_is_dir": _replace_by_dir(MODEL),
    "artifact_symlink_outside": _symlink_outside(MODEL),
    "artifact_folder_symlink_outside": _symlink_outside("decoder"),
    "tokenizer_missing": lambda root: (root / "tokenizer.json").unlink(),
    "tokenizer_truncated": _truncate("tokenizer.json", lambda n: n // 2),
    "tokenizer_wrong_schema": _replace_text("tokenizer.json", '{"foo": 1}'),
    "tokenizer_random_bytes": _random_bytes("tokenizer.json", 4096),
    "tokenizer_invalid_utf8": lambda root: (root / "tokenizer.json").write_bytes(b'{"a": "\xff"}'),
    "tokenizer_small_vocab": _small_tokenizer,
    "tokenizer_symlink_outside": _symlink_outside("tokenizer.json"),
    "tokenizer_is_dir": _replace_by_dir("tokenizer.json"),
    "tokenizer_fifo": _fifo("tokenizer.json"),
    "external_dotdot": _set_external("location", _external_elsewhere),
    "external_absolute": _set_external("location", _external_absolute),
    "external_missing": _external_then(lambda root: (root / "decoder" / DATA).unlink()),
    "external_truncated": _external_then(_truncate(f"decoder/{DATA}", lambda n: n // 2)),
    "external_symlink_outside": _external_then(_symlink_outside(f"decoder/{DATA}")),
    "external_offset_huge": _set_external("offset", lambda root: str(2 ** 50)),
    "external_length_huge": _set_external("length", lambda root: str(2 ** 40)),
    "external_offset_negative": _set_external("offset", lambda root: "-100"),
    "external_length_folded": _folded_bias_with_huge_length,
}
