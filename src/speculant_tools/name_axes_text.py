"""The text side of `speculant metadata name-axes`: rewrite the chosen `sequence` tokens in
place (every other byte, comment and quote kept), check the rewrite parses to the intended
document, and replace the file atomically."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from speculant.errors import MetadataError


def _parse(text: str, file: str) -> Any:
    try:
        document = YAML(typ="rt").load(text)
    except YAMLError as exc:  # duplicate keys included
        raise MetadataError(f"cannot parse the document: {exc}", file=file) from exc
    if not isinstance(document, dict):
        raise MetadataError("the document root is not a mapping", file=file,
                            value=type(document).__name__, expected="a mapping")
    return document


# -- where shape symbols live ---------------------------------------------------------------


def _dotted(keys: tuple[Any, ...]) -> str:
    return ".".join(str(key) for key in keys)


@dataclass(frozen=True)
class _Site:
    """One ``sequence`` entry of a contract's ``shape`` list."""

    keys: tuple[Any, ...]  # path from the document root to the shape list
    shape: Any  # the shape list itself (a ruamel CommentedSeq)
    index: int

    @property
    def path(self) -> str:
        return _dotted((*self.keys, self.index))

    @property
    def position(self) -> tuple[int, int]:
        return self.shape.lc.item(self.index)  # 0-based (line, column)


_TOKEN = re.compile(r"""(?P<quote>['"]?)sequence(?P=quote)(?![\w.-])""")


def _rewrite_text(text: str, renames: list[tuple[_Site, str]], file: str) -> str:
    """``text`` with the symbol at each site replaced, nothing else touched."""
    line_starts = [0] + [match.end() for match in re.finditer("\n", text)]
    edits = {}  # start offset -> (end, replacement); a shared (anchored) list is edited once
    for site, role in renames:
        line, column = site.position
        start = line_starts[line] + column
        match = _TOKEN.match(text, start)
        if match is None:
            raise MetadataError("cannot rewrite this shape symbol in place", file=file,
                                path=site.path, value=text[start:start + 20],
                                remedy="rename it by hand")
        quote = match.group("quote")
        edits[start] = (match.end(), f"{quote}{role}{quote}")
    pieces, cursor = [], 0
    for start, (end, replacement) in sorted(edits.items()):
        pieces += [text[cursor:start], replacement]
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(value) for value in node]
    return node


def _check_rewrite(new_text: str, document: Any, renames: list[tuple[_Site, str]],
                   file: str) -> None:
    """The rewritten text must parse to the old document with exactly the renames applied."""
    expected = _plain(document)
    for site, role in renames:
        node = expected
        for key in site.keys:
            node = node[key]
        node[site.index] = role
    if _plain(_parse(new_text, file)) != expected:
        raise MetadataError("the in-place rewrite does not parse back to the renamed document",
                            file=file, remedy="rename the axes by hand; please report this file")


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, keeping its permissions (through a symlink: to
    the file it points at)."""
    path = path.resolve()
    mode = path.stat().st_mode
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
