"""Metadata document: discovery (metadata.md §2.1), parsing (§1 rule 4) and typing.

Parsing is strict: YAML through a safe loader that refuses duplicate mapping keys, JSON without
duplicate keys or non-finite constants, a mapping at the root. Typing goes through the pydantic
models of ``package.model``; every validation error becomes a :class:`Problem` with the dotted
document path, the offending value and what was expected, and all of them are raised together.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from speculant.errors import MetadataError, Problem, ProblemCollector
from speculant.package.model import Document

STEP_KEYS = {"invoke": "one of the keys kind, component, inputs, outputs",
             "emit": "one of the keys kind, value, output, mode, axis, when, valid_length"}
METADATA_NAMES = ("inference_metadata.yaml", "inference_metadata.yml", "inference_metadata.json")


# -- discovery ----------------------------------------------------------------------------
def find_metadata(root: Path) -> Path:
    """The first of ``inference_metadata.{yaml,yml,json}`` that is a regular file in ``root``."""
    for name in METADATA_NAMES:
        candidate = root / name
        if candidate.is_file():
            return candidate
    raise MetadataError(f"no inference_metadata.{{yaml,yml,json}} in {root}", file=str(root),
                        expected="one of " + ", ".join(METADATA_NAMES))


# -- parsing ------------------------------------------------------------------------------
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present


class StrictSafeLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """``yaml.SafeLoader`` (on libyaml's parser when available) that refuses a mapping with
    the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: let the base class report it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first defined on line {first.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_text(text: str, file: str, *, is_json: bool) -> dict[str, Any]:
    """The document root of ``text`` as a mapping; ``MetadataError`` on any parse failure."""
    try:
        if is_json:
            data = json.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
        else:
            data = yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, ValueError) as exc:
        raise MetadataError(_parse_message(exc), file=file,
                            expected="valid JSON" if is_json else "valid YAML") from None
    if not isinstance(data, dict):
        raise MetadataError("the document root is not a mapping", file=file,
                            value=type(data).__name__, expected="a mapping")
    return data


def _parse_message(exc: Exception) -> str:
    """"duplicate key 'a' (first defined on line 1) at line 2, column 1" rather than
    PyYAML's multi-line report."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        where = exc.problem_mark or exc.context_mark
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        kind = "" if exc.problem.startswith("found duplicate key") else "parse error: "
        context = f" ({exc.context})" if exc.context and kind else ""
        return f"{kind}{exc.problem.removeprefix('found ')}{at}{context}"
    if isinstance(exc, json.JSONDecodeError):
        return f"parse error: {exc.msg} at line {exc.lineno}, column {exc.colno}"
    text = str(exc)
    return text if text.startswith("duplicate key") else f"parse error: {text}"


# -- typing -------------------------------------------------------------------------------
def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types an annotation may hold (``X | None``, ``Annotated[X, ...]``)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [t for a in get_args(annotation) for t in _unwrap(a)]
    return [annotation]


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that validates the object at document location ``loc``."""
    current: list[Any] = [Document]
    for part in loc:
        following: list[Any] = []
        for annotation in current:
            for candidate in _unwrap(annotation):
                origin = get_origin(candidate)
                if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                    field = candidate.model_fields.get(str(part))
                    if field is None:
                        field = next((f for f in candidate.model_fields.values()
                                      if f.alias == part), None)
                    if field is not None:
                        following.append(field.annotation)
                elif origin is dict:
                    following.append(get_args(candidate)[1])
                elif origin is list and isinstance(part, int):
                    following.append(get_args(candidate)[0])
        current = following
    for annotation in current:
        for candidate in _unwrap(annotation):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                return candidate
    return None


def _allowed_keys(model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    keys = [field.alias or name for name, field in model.model_fields.items()]
    return "one of the keys " + ", ".join(sorted(keys))


def _data_path(data: Any, loc: tuple[Any, ...], *, keep_last: bool) -> tuple[Any, ...]:
    """``loc`` without pydantic's union tags ("constrained-int", "function-after[...]"):
    keep only the parts that index into ``data`` (and the last one of a missing key)."""
    kept: list[Any] = []
    current = data
    for index, part in enumerate(loc):
        if isinstance(current, dict) and part in current:
            kept.append(part)
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            kept.append(part)
            current = current[part]
        elif keep_last and index == len(loc) - 1:
            kept.append(part)
    return tuple(kept)


def dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def validation_problems(exc: ValidationError, data: dict[str, Any], file: str) -> list[Problem]:
    """One problem per offending document path; alternatives of a union are merged."""
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for error in exc.errors():
        loc = _data_path(data, tuple(error["loc"]), keep_last=error["type"] == "missing")
        ctx = error.get("ctx") or {}
        if error["type"] == "field_error":
            loc = loc + tuple(ctx["field"].split("."))
        if error["type"] == "unknown_keys":
            for key in ctx["keys"]:
                grouped.setdefault(loc + (key,), []).append(
                    {**error, "type": "extra_forbidden", "input": _value_at(data, loc + (key,)),
                     "expected": STEP_KEYS.get(ctx["kind"], "")})
            continue
        grouped.setdefault(loc, []).append(error)

    problems = []
    for loc, errors in grouped.items():
        path = dotted(loc)
        first = errors[0]
        ctx = first.get("ctx") or {}
        if first["type"] == "extra_forbidden":
            expected = first.get("expected") or _allowed_keys(_model_at(loc[:-1]))
            problems.append(Problem(MetadataError, f"unknown key '{loc[-1]}'", path, file,
                                    first["input"], expected))
        elif first["type"] == "missing":
            problems.append(Problem(MetadataError, f"missing required key '{loc[-1]}'", path,
                                    file, None, f"a value for '{loc[-1]}'"))
        elif len(errors) > 1:
            expected = "; or ".join(dict.fromkeys(_message(e) for e in errors))
            problems.append(Problem(MetadataError, "value matches none of the accepted forms",
                                    path, file, _value_at(data, loc), expected))
        else:
            expected = str(ctx.get("expected", "")) if first["type"] == "literal_error" else ""
            problems.append(Problem(MetadataError, _message(first), path, file,
                                    _value_at(data, loc), expected))
    return problems


def _message(error: dict[str, Any]) -> str:
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def to_document(data: dict[str, Any], file: str) -> Document:
    """Type a parsed root mapping; ``MetadataError`` listing every validation problem."""
    try:
        return Document.model_validate(data, strict=True)
    except ValidationError as exc:
        collector = ProblemCollector(file)
        collector.extend(validation_problems(exc, data, file))
        collector.raise_if_any()
        raise  # unreachable: a ValidationError has at least one error


def read_document(path: str | Path) -> Document:
    """Parse and type one metadata file (``.json`` is JSON, anything else YAML)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MetadataError(f"cannot read the metadata file: {exc}", file=str(path)) from None
    data = parse_text(text, str(path), is_json=path.suffix == ".json")
    return to_document(data, str(path))
