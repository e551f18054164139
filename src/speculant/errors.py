"""The typed error tree (docs/design/spec/README.md, "Conventions").

Every error speculant raises on bad input is one of these classes. An error carries one or
more :class:`Problem` records; each names where it happened (file and document path), the
offending value, what was expected and, where one exists, the remedy. Load collects all
problems of a package and raises them together (docs/design/spec/metadata.md §1 rule 3).

Rendering is bounded, whatever the input: an offending value is shown through :func:`shown`
(a few levels, a few items, a few hundred characters), every problem renders on one line of
at most ``MAX_PROBLEM_CHARS``, and an error lists at most ``MAX_PROBLEMS_SHOWN`` problems (all
of them stay in ``.problems``). A hostile document (a YAML alias bomb, a 10 MB string) thus
costs no more to report than a small one.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from dataclasses import dataclass

MAX_VALUE_CHARS = 160  # the longest rendering of an offending value
MAX_PROBLEM_CHARS = 1000  # the longest rendering of one problem
MAX_PROBLEMS_SHOWN = 12  # problems listed in an error's message; .problems holds all
INSTALL_CUDA = "pip install 'speculant[cuda]'"  # the remedy of every missing CUDA build


class _BoundedRepr(reprlib.Repr):
    """``reprlib`` with small limits, and huge integers summarized rather than converted
    (``repr`` of an integer over 4,300 digits raises ``ValueError``)."""

    def __init__(self) -> None:
        super().__init__()  # keyword limits arrive in Python 3.12
        self.maxlevel = 3
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = 6
        self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxstring, self.maxlong, self.maxother = 60, 40, 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<an integer of {len(hex(x)) - 2} hex digits>"
        return super().repr_int(x, level)


_REPR = _BoundedRepr()


def shown(value: object) -> str:
    """``repr(value)``, bounded in depth, width and length: safe for any offending value."""
    try:
        text = _REPR.repr(value)
    except Exception:  # a value whose own __repr__ fails: name its type instead
        text = f"<{type(value).__name__}>"
    return _clip(text, MAX_VALUE_CHARS)


def _clip(text: str, limit: int) -> str:
    """``text`` on one line (newlines folded to spaces), at most ``limit`` characters."""
    if "\n" in text or "\r" in text:
        text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Problem:
    """One finding: what is wrong, where, and what to do about it."""

    kind: type[SpeculantError]
    message: str
    path: str = ""  # document path, e.g. "pipeline.workflow.state.kv.0.key.recurrence.axis"
    file: str = ""  # the file the path is in (metadata document, artifact, ...)
    value: object = None  # the offending value, when there is one
    expected: str = ""  # what would have been accepted
    remedy: str = ""  # what the user can do
    rule: str = ""  # the spec's rule id ("28", "A6", "P2"), where the finding enforces one

    def render(self) -> str:
        where = ": ".join(part for part in (self.file, self.path) if part)
        message = _clip(self.message, MAX_PROBLEM_CHARS)
        text = f"{where}: {message}" if where else message
        if self.value is not None:
            value = shown(self.value)
            if value not in message:
                text += f" (got {value})"
        if self.expected:
            text += f"; expected {self.expected}"
        if self.remedy:
            text += f". Remedy: {self.remedy}"
        return _clip(text, MAX_PROBLEM_CHARS)


class SpeculantError(Exception):
    """Base class. ``problems`` lists every finding (one for most run-time errors)."""

    def __init__(
        self,
        message: str = "",
        *,
        path: str = "",
        file: str = "",
        value: object = None,
        expected: str = "",
        remedy: str = "",
        problems: Iterable[Problem] | None = None,
    ) -> None:
        if problems is None:
            problems = [Problem(type(self), message, path, file, value, expected, remedy)]
        self.problems: list[Problem] = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        """One line: the problem, or "N problems: (1) [Kind] ...; (2) ..." (the first
        ``MAX_PROBLEMS_SHOWN``, then how many more)."""
        if len(self.problems) == 1:
            return self.problems[0].render()
        parts = [f"({i}) [{p.kind.__name__}] {p.render()}"
                 for i, p in enumerate(self.problems[:MAX_PROBLEMS_SHOWN], 1)]
        more = len(self.problems) - MAX_PROBLEMS_SHOWN
        if more > 0:
            parts.append(f"and {more} more (all in the error's .problems)")
        return f"{len(self.problems)} problems: " + "; ".join(parts)

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.problems]


class MetadataError(SpeculantError):
    """The document breaks a rule of the standard."""


class UnsupportedError(SpeculantError):
    """Valid, but outside speculant's subset."""


class AdmissionError(SpeculantError):
    """The document disagrees with its ONNX graphs."""


class RequestError(SpeculantError):
    """A request cannot be admitted."""


class ContractError(SpeculantError):
    """A bound or produced value breaks its contract."""


class ChainError(SpeculantError):
    """A chained proposal cannot proceed."""


class ResidencyError(SpeculantError):
    """The tensor seam refuses an operation."""


# When collected problems of several classes are raised together, the exception's class is
# the first of these that occurs (a broken document outranks an unsupported one, and both
# outrank a disagreement with the graphs, which is only checked once the document is valid).
_RAISE_ORDER: tuple[type[SpeculantError], ...] = (MetadataError, UnsupportedError, AdmissionError)


class ProblemCollector:
    """Collects problems while a whole document is checked, then raises them together."""

    def __init__(self, file: str = "") -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(
        self,
        kind: type[SpeculantError],
        message: str,
        *,
        path: str = "",
        value: object = None,
        expected: str = "",
        remedy: str = "",
        file: str | None = None,
        rule: str = "",
    ) -> None:
        self.problems.append(
            Problem(kind, message, path, self.file if file is None else file, value, expected,
                    remedy, rule)
        )

    def extend(self, problems: Iterable[Problem]) -> None:
        self.problems.extend(problems)

    def __bool__(self) -> bool:
        return bool(self.problems)

    def raise_if_any(self) -> None:
        if not self.problems:
            return
        kinds = {p.kind for p in self.problems}
        cls = next((k for k in _RAISE_ORDER if k in kinds), self.problems[0].kind)
        raise cls(problems=self.problems)
