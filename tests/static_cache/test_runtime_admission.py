"""Admission of static-cache packages (docs/design/static-cache.md, *Admission*): what load
derives, the typed error of each malformed static field, and a request too large for the
capacity."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

import speculant
from speculant.errors import MetadataError, RequestError
from speculant.package import validate_document
from speculant.package.document import to_document

GROUP = "pipeline.workflow.serving.state_service.groups.attention"
STATE = "pipeline.workflow.state"


def document(root: Path) -> dict:
    return yaml.safe_load((root / "inference_metadata.yaml").read_text())


def problems_of(doc: dict) -> dict[str, str]:
    """path -> message of every MetadataError of ``doc``."""
    found = validate_document(to_document(doc, "<test>"))
    assert {p.kind for p in found} <= {MetadataError}
    return {p.path: p.message for p in found}


@pytest.fixture
def static_doc(pairs) -> dict:
    return copy.deepcopy(document(pairs["scatter-float32", "static"]))


def group_of(doc: dict) -> dict:
    return doc["pipeline"]["workflow"]["serving"]["state_service"]["groups"]["attention"]


def test_the_plan_of_a_static_pair(pairs, draft_packages):
    plan = speculant.load(pairs["scatter-float32", "static"]).package.plan
    assert plan.static is not None
    assert (plan.static.lengths_cell, plan.static.lengths_input) == ("cache_lengths",
                                                                     "request.cache_lengths")
    assert plan.static.capacity_input == "package.capacity" and plan.static.capacity == 64
    assert plan.static.capacity_symbol == "capacity"
    assert plan.static.kv_length_ports == {"target": "cache_lengths",
                                           "assistant": "cache_lengths"}
    assert plan.driver_bound["request.cache_lengths"] == "cache_lengths"
    assert "cache_lengths" not in plan.cells  # the driver's, not a cache
    draft_plan = speculant.load(draft_packages["static"]).package.plan
    assert draft_plan.static is not None and draft_plan.static.write_indices_ports == {
        "decoder": "cache_lengths"}
    assert speculant.load(pairs["scatter-float32", "appended"]).package.plan.static is None


def test_logical_lengths_naming_no_state_cell(static_doc):
    group_of(static_doc)["logical_lengths"] = "lengths"
    found = problems_of(static_doc)
    assert "'lengths' names no state cell" in found[f"{GROUP}.logical_lengths"]


def test_write_indices_naming_no_state_cell(static_doc):
    group_of(static_doc)["update"]["write_indices"] = "request.cache_lengths"
    found = problems_of(static_doc)
    assert "names no state cell" in found[f"{GROUP}.update.write_indices"]


def test_a_length_port_the_component_does_not_declare(static_doc):
    group_of(static_doc)["update"]["kv_length_ports"]["assistant"] = "attention_mask"
    found = problems_of(static_doc)
    message = found[f"{GROUP}.update.kv_length_ports.assistant"]
    assert "'attention_mask' is not a declared input of component 'assistant'" in message


def test_a_length_port_that_is_not_rank_1_int64(static_doc):
    ports = static_doc["pipeline"]["workflow"]["components"]["target"]["ports"]["inputs"]
    ports["cache_lengths"]["dtype"] = "int32"
    found = problems_of(static_doc)
    assert "int32[batch]" in found[f"{GROUP}.update.write_indices_ports.target"]
    assert "int32[batch]" in found[f"{GROUP}.update.kv_length_ports.target"]


def test_a_cache_cell_whose_sequence_extent_is_not_the_capacity_symbol(static_doc):
    static_doc["pipeline"]["workflow"]["state"]["kv.1.value"]["contract"]["shape"][2] = 64
    found = problems_of(static_doc)
    assert "extent 64 on its sequence axis 2" in found[f"{STATE}.kv.1.value.contract.shape.2"]
    static_doc["pipeline"]["workflow"]["state"]["kv.1.value"]["contract"]["shape"][2] = "other"
    found = problems_of(static_doc)
    assert "capacity symbol 'other'" in found[f"{STATE}.kv.1.value.contract.shape.2"]


def test_a_capacity_naming_no_workflow_input(static_doc):
    group_of(static_doc)["update"]["capacity"] = "package.context"
    found = problems_of(static_doc)
    assert "not a workflow input" in found[f"{GROUP}.update.capacity"]


def test_a_request_that_cannot_fit_the_capacity(pairs):
    """P + max_new_tokens + k + 1 > package.capacity (64): a RequestError with the numbers,
    before any pass; the largest request that fits is admitted."""
    engine = speculant.load(pairs["scatter-float32", "static"])
    prompt = [7, 3, 41, 12, 25, 9]
    with pytest.raises(RequestError) as info:
        engine.admit(prompt, max_new_tokens=54, proposer="chained", k=4)
    message = str(info.value)
    assert "needs 65 cache slots (prompt 6 + max_new_tokens 54 + k 4 + 1)" in message
    assert "package.capacity = 64" in message
    state = engine.admit(prompt, max_new_tokens=53, proposer="chained", k=4)
    assert state.cells.capacity == 64
    # the engine's pool rounds a capacity up (to 128 slots, at most the package's 64)
    assert engine.admit(prompt, max_new_tokens=10).cells.capacity == 64


def test_requests_reuse_the_engines_buffers_and_plans(pairs):
    """Static caches and their pass plans are made once per (capacity, width) for an engine,
    not per request: a second request runs on the same buffers and plans, and the prefill's
    one-off plan is never kept (so CUDA graphs do not pile up request after request)."""
    engine = speculant.load(pairs["scatter-float32", "static"])
    first = engine.generate([7, 3, 41, 12, 25, 9], 12, proposer="chained", k=4)
    cells = engine.static_pool._cells
    assert len(cells) == 1
    (only,) = cells.values()
    plans = dict(only.plans)
    assert plans and all(n <= 5 for n in plans)  # verify widths only: no prefill width kept
    drafter_steps = only.chain_steps
    drafter_plans = list(drafter_steps.plans)
    second = engine.generate([7, 3, 41, 12, 25, 9, 2, 8], 12, proposer="chained", k=4)
    assert len(engine.static_pool._cells) == 1
    assert {n: id(p) for n, p in only.plans.items() if n in plans} == \
        {n: id(p) for n, p in plans.items()}
    assert only.chain_steps is drafter_steps
    assert drafter_steps.plans[:len(drafter_plans)] == drafter_plans  # the same step plans
    assert first.token_ids == engine.generate([7, 3, 41, 12, 25, 9], 12).token_ids
    assert second.token_ids == engine.generate([7, 3, 41, 12, 25, 9, 2, 8], 12).token_ids
