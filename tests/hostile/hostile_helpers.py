"""Helpers of the hostile-input tests: alias bombs as text, the one-line check."""

from __future__ import annotations

from click.testing import Result


def laughs(levels: int, width: int = 9) -> str:
    """A flow mapping of anchors ``l0 .. l<levels>``, each a list of ``width`` aliases of the
    one before: the value ``*l<levels>`` stands for ``width ** levels`` strings."""
    anchors = ['l0: &l0 "lol"'] + [
        f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "{" + ", ".join(anchors) + "}"


def billion_laughs() -> str:
    """The 545-byte document of the review (D1): nine levels of nine, as ``schema_version``."""
    return f"quantization: {laughs(9)}\nschema_version: *l9\n"


def one_line(result: Result) -> str:
    """The stderr of a failed command, asserted to be exactly one line without a traceback."""
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1, result.stderr
    return lines[0]
