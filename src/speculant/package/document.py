"""Metadata document: discovery (docs/design/spec/metadata.md §2.1), parsing and typing.

Parsing is strict: YAML through a safe loader that refuses duplicate mapping keys, JSON without
duplicate keys or non-finite constants, a mapping at the root. It is also bounded, so that no
document costs more to refuse than its size: a document may hold at most ``MAX_NODES`` nodes
with its YAML aliases expanded (counted on the composed node graph before anything is
constructed, so a "billion laughs" bomb is refused in microseconds; a recursive alias is
refused too), may nest at most ``MAX_DEPTH`` levels, and its strings must be valid Unicode (a
JSON ``"\ud800"`` escape is a lone surrogate, which YAML's parser refuses as well).
Typing goes through the pydantic models of ``package.model``; every validation error becomes a
:class:`Problem` with the dotted document path, the offending value and what was expected, and
all of them are raised together.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from speculant.errors import MetadataError, Problem, ProblemCollector, shown
from speculant.package.model import Document
from speculant.package.paths import confine

STEP_KEYS = {"invoke": "one of the keys kind, component, inputs, outputs",
             "emit": "one of the keys kind, value, output, mode, axis, when, valid_length"}
METADATA_NAMES = ("inference_metadata.yaml", "inference_metadata.yml", "inference_metadata.json")
MAX_NODES = 200_000  # nodes of a document, YAML aliases expanded (the demo holds 1,941)
MAX_DEPTH = 100  # nesting levels of mappings and lists


# -- discovery ----------------------------------------------------------------------------
def find_metadata(root: Path) -> Path:
    """The first of ``inference_metadata.{yaml,yml,json}`` that is a regular file in ``root``.

    The metadata file is confined like every other file of the package: a symlink to a file
    outside the folder is a ``MetadataError``."""
    for name in METADATA_NAMES:
        candidate = root / name
        if candidate.is_file():
            problems = ProblemCollector(str(root))
            confine(Path(os.path.realpath(root)), name, "", problems, what="metadata file")
            problems.raise_if_any()
            return candidate
    raise MetadataError(f"no inference_metadata.{{yaml,yml,json}} in {root}", file=str(root),
                        expected="one of " + ", ".join(METADATA_NAMES))


# -- parsing ------------------------------------------------------------------------------
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present


class DocumentTooLarge(ValueError):
    """A document past ``MAX_NODES`` or ``MAX_DEPTH``, with a recursive alias, or with a
    string that is not valid Unicode; ``expected`` says what would be accepted."""

    def __init__(self, message: str, expected: str) -> None:
        super().__init__(message)
        self.expected = expected


class StrictSafeLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """``yaml.SafeLoader`` (on libyaml's parser when available) that refuses a mapping with
    the same key twice, and measures the composed document before constructing it."""

    def construct_document(self, node: yaml.Node) -> Any:
        _measure(node)
        return super().construct_document(node)

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
                    f"found duplicate key {shown(key)} (first defined on line "
                    f"{first.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(root: yaml.Node) -> None:
    """Refuse a composed YAML document over ``MAX_NODES`` nodes (aliases expanded, each
    shared node measured once) or ``MAX_DEPTH`` levels, or with a recursive alias."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, depth)
    open_nodes: set[int] = set()  # the nodes on the path being walked
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, is_closing = stack.pop()
        key = id(node)
        if is_closing:
            sizes = [measured[id(child)] for child in _children(node)]
            count = 1 + sum(n for n, _ in sizes)
            depth = 1 + max((d for _, d in sizes), default=0)
            open_nodes.discard(key)
            measured[key] = (count, depth)
            _check_size(count, depth, f" (at line {node.start_mark.line + 1})")
            continue
        if key in measured:
            continue
        if key in open_nodes:
            raise DocumentTooLarge(f"a recursive alias at line {node.start_mark.line + 1} "
                                   "(a node that contains itself)",
                                   "aliases that refer to complete nodes only")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in measured)


def _check_size(count: int, depth: int, where: str = "") -> None:
    if count > MAX_NODES:
        raise DocumentTooLarge(f"the document holds more than {MAX_NODES:,} nodes with its "
                               f"aliases expanded{where}", f"at most {MAX_NODES:,} nodes "
                               "(an alias counts the nodes it stands for, each time)")
    if depth > MAX_DEPTH:
        raise DocumentTooLarge(f"the document nests more than {MAX_DEPTH} levels deep{where}",
                               f"at most {MAX_DEPTH} levels of nested mappings and lists")


def _check_data(data: Any) -> None:
    """Size, depth and Unicode of a parsed JSON document (no sharing: a plain walk)."""
    count = 0
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        count += 1
        _check_size(count, depth, f" (at '{path}')" if path else "")
        if isinstance(value, str):
            _check_unicode(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_unicode(key, path)
                stack.append((item, depth + 1, f"{path}.{key}" if path else key))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, f"{path}.{i}" if path else str(i))
                         for i, item in enumerate(value))


def _check_unicode(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        at = f" at '{path}'" if path else ""
        raise DocumentTooLarge(f"a string{at} holds a lone surrogate "
                               f"{shown(text[exc.start:exc.end])}, which is not valid "
                               "Unicode", "strings of Unicode characters (a \\uD800-\\uDFFF "
                               "escape only as half of a surrogate pair)") from None


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {shown(key)}")
        result[key] = value
    return result


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_text(text: str, file: str, *, is_json: bool) -> dict[str, Any]:
    """The document root of ``text`` as a mapping; ``MetadataError`` on any parse failure."""
    try:
        if is_json:
            data = json.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
            _check_data(data)
        else:
            data = yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 (a SafeLoader)
    except DocumentTooLarge as exc:
        raise MetadataError(str(exc), file=file, expected=exc.expected) from None
    except RecursionError:
        raise MetadataError(f"the document nests more than {MAX_DEPTH} levels deep", file=file,
                            expected=f"at most {MAX_DEPTH} levels of nesting") from None
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
        raise MetadataError(f"cannot read the metadata file: {exc}", file=str(path),
                            expected="a regular file of UTF-8 text") from None
    data = parse_text(text, str(path), is_json=path.suffix == ".json")
    return to_document(data, str(path))
