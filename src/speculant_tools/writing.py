"""Writing packages to disk: ONNX graphs (``.onnx`` binary or ``.onnx.textproto``) and
``inference_metadata.yaml`` documents in the spec's compact style; the contract helpers both
the exporters and the test builders use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import yaml
from google.protobuf import text_format

CAPABILITIES = ["workflow_ssa", "typed_emit", "serving_service_contract",
                "bounded_state_recurrence"]
ALIGNED = {"kind": "request_aligned", "axis": 0}


def contract(dtype: str, shape: list, aligned: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"dtype": dtype, "rank": len(shape), "shape": list(shape)}
    if aligned:
        body["batch_layout"] = dict(ALIGNED)
    return body


def opaque_input(name: str, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"contract": body, "role": {"kind": "opaque"},
            "source": {"kind": "application", "name": name}, "required": True, **extra}


class _Dumper(yaml.SafeDumper):
    """No anchors; contracts, flat mappings and lists of scalars are written on one line,
    as in the spec's examples."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return max((_depth(v) for v in value), default=0)
    return 0


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(),
                                    flow_style=_depth(data) <= 1 or "dtype" in data)


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                     flow_style=_depth(data) == 0)


_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)


def write_model(model: onnx.ModelProto, path: Path) -> Path:
    """Binary for ``.onnx``, protobuf text format for ``.onnx.textproto``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".onnx.textproto"):
        path.write_text(text_format.MessageToString(model))
    elif path.suffix == ".onnx":
        path.write_bytes(model.SerializeToString())
    else:
        raise ValueError(f"artifact must end in .onnx or .onnx.textproto: {path}")
    return path


def read_model(path: Path) -> onnx.ModelProto:
    """The inverse of :func:`write_model`."""
    if str(path).endswith(".onnx.textproto"):
        return text_format.Parse(Path(path).read_text(), onnx.ModelProto())
    return onnx.load(str(path))


def write_metadata(document: dict[str, Any], root: str | Path, header: str = "") -> Path:
    """``root/inference_metadata.yaml`` (e.g. a one-edit mutation of a fixture's document,
    from :func:`chained_metadata` / :func:`decoder_metadata`), ``header`` as a comment."""
    path = Path(root) / "inference_metadata.yaml"
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=1000)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    path.write_text(comment + body)
    return path
