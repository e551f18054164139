"""The typed error tree (spec README, "Conventions").

Every error speculant raises on bad input is one of these classes. An error carries one or
more :class:`Problem` records; each names where it happened (file and document path), the
offending value, what was expected and, where one exists, the remedy. Load collects all
problems of a package and raises them together (metadata.md §1 rule 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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
        text = f"{where}: {self.message}" if where else self.message
        if self.value is not None and repr(self.value) not in self.message:
            text += f" (got {self.value!r})"
        if self.expected:
            text += f"; expected {self.expected}"
        if self.remedy:
            text += f". Remedy: {self.remedy}"
        return text


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
        if len(self.problems) == 1:
            return self.problems[0].render()
        lines = [f"{len(self.problems)} problems:"]
        lines += [f"  - [{p.kind.__name__}] {p.render()}" for p in self.problems]
        return "\n".join(lines)

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
