"""Rendering an error is bounded whatever it carries (review D1): ``shown`` caps depth, width
and length; a problem renders on one line; an error lists a bounded number of problems."""

from __future__ import annotations

import time

import pytest
from hostile_helpers import laughs

from speculant.errors import (
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS_SHOWN,
    MAX_VALUE_CHARS,
    MetadataError,
    Problem,
    ProblemCollector,
    UnsupportedError,
    shown,
)
from speculant.package import load_package


def shared_bomb(levels: int, width: int = 9) -> list:
    """What PyYAML builds for an alias bomb: one list object shared ``width`` times per level,
    ``width ** levels`` leaves if expanded."""
    value: object = "lol"
    for _ in range(levels):
        value = [value] * width
    return value  # type: ignore[return-value]


def test_shown_of_a_billion_leaves_is_instant_and_short():
    started = time.perf_counter()
    text = shown(shared_bomb(9))
    assert time.perf_counter() - started < 0.1
    assert len(text) <= MAX_VALUE_CHARS and text.startswith("[[[")


HOSTILE_VALUES = {"long string": "x" * 10_000_000, "5000-digit int": 10 ** 5000,
                  "wide dict": {str(i): i for i in range(10 ** 5)}, "bytes": b"\x00" * 10 ** 6,
                  "nan": float("nan"), "surrogate": "a\ud800b", "newline": "line\nbreak"}


@pytest.mark.parametrize("name", HOSTILE_VALUES)
def test_shown_is_bounded_for_any_value(name):
    text = shown(HOSTILE_VALUES[name])
    assert len(text) <= MAX_VALUE_CHARS and "\n" not in text


def test_shown_survives_a_failing_repr():
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")
    assert shown(Hostile()).startswith("<Hostile")


def test_problem_render_of_a_bomb_is_bounded():
    started = time.perf_counter()
    error = MetadataError("Input should be a valid string", file="bomb.yaml",
                          path="schema_version", value=shared_bomb(9), expected="a string")
    assert time.perf_counter() - started < 0.1
    assert len(str(error)) < MAX_VALUE_CHARS + 200


def test_a_huge_message_renders_on_one_bounded_line():
    error = MetadataError("boom\n" * 100_000, file="f", value="v")
    assert "\n" not in str(error) and len(str(error)) <= MAX_PROBLEM_CHARS


def test_many_problems_render_on_one_line_and_all_are_kept():
    collector = ProblemCollector("f.yaml")
    for i in range(100):
        collector.add(MetadataError, f"problem {i}", path=f"p.{i}", value=shared_bomb(6))
    with pytest.raises(MetadataError) as caught:
        collector.raise_if_any()
    text = str(caught.value)
    assert text.startswith("100 problems: (1) [MetadataError] f.yaml: p.0: problem 0")
    assert "\n" not in text and f"and {100 - MAX_PROBLEMS_SHOWN} more" in text
    assert f"problem {MAX_PROBLEMS_SHOWN}" not in text
    assert len(caught.value.problems) == 100
    assert len(text) < MAX_PROBLEMS_SHOWN * MAX_PROBLEM_CHARS


def test_the_message_keeps_the_value_once():
    problem = Problem(MetadataError, "unknown dtype 'f33'", value="f33")
    assert problem.render() == "unknown dtype 'f33'"


def effects_package(decoder_copy, levels: int):
    root = decoder_copy()
    metadata = root / "inference_metadata.yaml"
    text = metadata.read_text().replace("  workflow:\n", f"  workflow:\n    effects: *l{levels}\n",
                                        1)
    metadata.write_text(f"quantization: {laughs(levels)}\n" + text)
    return root


def test_a_bomb_as_workflow_effects_on_the_full_package_path(decoder_copy):
    """Review D1: `load_metadata_only` returned at once, `load_package` hung rendering the
    unsupported finding. Nine levels: refused by the node budget; five: rendered, bounded."""
    started = time.perf_counter()
    with pytest.raises(MetadataError, match="aliases expanded"):
        load_package(effects_package(decoder_copy, 9))
    with pytest.raises(UnsupportedError) as caught:
        load_package(effects_package(decoder_copy, 5))
    assert time.perf_counter() - started < 3.0
    assert "pipeline.workflow.effects" in str(caught.value)
    assert len(str(caught.value)) < 2 * MAX_PROBLEM_CHARS
