"""Bad input to a chained run: each case is a typed error whose message or path names the
field (runtime.md §2.4, §3, §9, §19; metadata.md A6-A8 for what load refuses).

Run-time chain facts that load already verified are re-checked on the actual values; those
cases are reached by monkeypatching what a pass or the chain holds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from chain_helpers import PROBE_PROMPT
from onnx import numpy_helper

import speculant
from builders import VOCAB_SIZE
from speculant.errors import (
    AdmissionError,
    ChainError,
    ContractError,
    MetadataError,
    RequestError,
)
from speculant.tensors import Value

K = 4
TABLE_PATH = "speculative.proposal_execution.token_embedding.table"


def _speculate(engine, prompt=PROBE_PROMPT, max_new_tokens=16, **options):
    options = {"speculative": True, "k": K, **options}
    return engine.generate(list(prompt), max_new_tokens, **options)


# -- request ----------------------------------------------------------------------------------
def test_speculating_without_a_speculative_contract(decoder_root):
    engine = speculant.load(decoder_root)
    with pytest.raises(RequestError) as caught:
        _speculate(engine)
    assert caught.value.paths == ["speculative"]
    assert engine.generate(list(PROBE_PROMPT), 4).token_ids  # plain decoding still works


@pytest.mark.parametrize("k", [9, 64])
def test_k_above_max_proposal_width(pair_engine, k):
    with pytest.raises(RequestError) as caught:
        _speculate(pair_engine(), k=k)
    assert "max_proposal_width" in str(caught.value)
    assert caught.value.paths == ["speculative.max_proposal_width"]


@pytest.mark.parametrize("k", [0, -1, 2.0, True])
def test_k_below_one_or_not_an_integer(pair_engine, k):
    with pytest.raises(RequestError) as caught:
        _speculate(pair_engine(), k=k)
    assert caught.value.paths == ["k"]


def test_k_absent_is_max_proposal_width(pair_engine):
    engine = pair_engine()
    width = engine.package.document.speculative.max_proposal_width
    assert _speculate(engine, k=None).stats.trace == _speculate(engine, k=width).stats.trace


@pytest.mark.parametrize(("prompt", "bad"), [((5, VOCAB_SIZE), VOCAB_SIZE), ((-1, 3), -1),
                                             ((5, 1000), 1000)],
                         ids=["vocab_size", "negative", "far_out"])
def test_prompt_id_outside_the_vocabulary(pair_engine, prompt, bad):
    with pytest.raises(RequestError) as caught:
        _speculate(pair_engine(), prompt)
    assert caught.value.paths == ["prompt_ids"]
    assert f"[{bad}]" in str(caught.value)


def test_prompt_filling_the_context(pair_engine):
    engine = pair_engine()
    with pytest.raises(RequestError) as caught:  # M = max_sequence_length = 64
        _speculate(engine, [5] * 64)
    assert "prompt fills the context" in str(caught.value)
    with pytest.raises(RequestError) as caught:  # M = the request's max_context
        _speculate(engine, [5, 9, 3, 4], max_context=4)
    assert "prompt fills the context" in str(caught.value)
    # One position short of the cap: the prompt is admitted and one token is generated.
    assert len(_speculate(engine, [5, 9, 3], max_context=4).token_ids) == 1


@pytest.mark.parametrize(("prompt", "max_new_tokens", "path"),
                         [((), 8, "prompt_ids"), (PROBE_PROMPT, 0, "max_new_tokens")])
def test_empty_prompt_or_no_budget(pair_engine, prompt, max_new_tokens, path):
    with pytest.raises(RequestError) as caught:
        _speculate(pair_engine(), prompt, max_new_tokens)
    assert caught.value.paths == [path]


# -- shape symbols ----------------------------------------------------------------------------
def test_input_extent_contradicting_a_bound_symbol(pair_engine):
    """A caller's ``inputs_embeds`` of 7 rows where the pass binds ``sequence`` = 3."""
    with pytest.raises(ContractError) as caught:
        _speculate(pair_engine(), inputs={"inputs_embeds": np.zeros((1, 7, 32), np.float32)})
    message = str(caught.value)
    assert caught.value.paths == ["sequence"]
    assert "'sequence'" in message and "7" in message and "3" in message


def test_input_extent_contradicting_a_fixed_contract_dim(pair_engine):
    with pytest.raises(ContractError) as caught:
        _speculate(pair_engine(), inputs={"inputs_embeds": np.zeros((1, 3, 31), np.float32)})
    assert caught.value.paths == ["request.inputs_embeds"]
    assert "31" in str(caught.value) and "32" in str(caught.value)


def test_present_with_the_wrong_extent(pair_engine, monkeypatch):
    """§4: a present whose extent is not C0 + n is a ContractError naming it."""
    engine = pair_engine()
    invoke = engine.target.session.invoke

    def short_present(inputs, outputs=None, **options):
        produced = invoke(inputs, outputs, **options)
        key = produced["present.0.key"]
        produced["present.0.key"] = Value.host(np.array(key.data[:, :, :-1]), key.dtype)
        return produced

    monkeypatch.setattr(engine.target.session, "invoke", short_present)
    with pytest.raises(ContractError) as caught:
        _speculate(engine)
    assert caught.value.paths == ["present.0.key"]


# -- the embedding table at load (A6-A8) -------------------------------------------------------
def _table(name: str):
    def edit(document: dict) -> None:
        document["speculative"]["proposal_execution"]["token_embedding"]["table"] = name
    return edit


def _add_initializer(name: str, array: np.ndarray):
    def edit(model) -> None:
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return edit


@pytest.mark.parametrize(
    ("table", "graph_edit", "expected"),
    [("no_such_table", None, ["not an initializer", "no_such_table"]),
     ("input_ids", None, ["not an initializer", "input_ids"]),  # a graph input, not data
     ("deviation_table", None, ["[64]", "rank 2"]),  # 1-D (and int64)
     ("embed_3d", _add_initializer("embed_3d", np.full((32, 16, 1), 0.5, np.float32)),
      ["[32, 16, 1]", "rank 2"])],
    ids=["missing", "graph_input", "one_dimensional", "three_dimensional"])
def test_table_not_a_two_dimensional_initializer(edited_pair, table, graph_edit, expected):
    root = edited_pair(f"table-{table}", _table(table), graph_edit)
    with pytest.raises(AdmissionError) as caught:
        speculant.load(root)
    assert TABLE_PATH in caught.value.paths
    for fragment in expected:
        assert fragment in str(caught.value)


def test_table_of_the_wrong_width(edited_pair):
    """W_E 8 + W_C 16 != W_F 32, named at load."""
    root = edited_pair("table-narrow", _table("embed_narrow"),
                       _add_initializer("embed_narrow", np.full((32, 8), 0.5, np.float32)))
    with pytest.raises(AdmissionError) as caught:
        speculant.load(root)
    message = str(caught.value)
    assert "speculative.proposal_execution.token_embedding_input" in caught.value.paths
    assert "W_E 8" in message and "W_C 16" in message and "W_F 32" in message


# -- the chain at run time (§9) -----------------------------------------------------------------
def test_token_outside_the_embedding_table(pair_engine, monkeypatch):
    engine = pair_engine()
    table = engine.proposer.table
    monkeypatch.setattr(engine.proposer, "_table", Value.host(np.array(table.data[:2]),
                                                              table.dtype))
    with pytest.raises(ChainError) as caught:
        _speculate(engine)  # s = 3 is the first row the chain embeds
    assert "token 3" in str(caught.value) and "2 rows" in str(caught.value)


def _patch_latest_seed(monkeypatch, engine, make_seed) -> None:
    run = engine.target.run

    def run_with_seed(*args, **kwargs):
        vp = run(*args, **kwargs)
        return dataclasses.replace(vp, seed=make_seed(vp.seed))

    monkeypatch.setattr(engine.target, "run", run_with_seed)


def test_seed_output_not_bound_by_the_target_invoke(edited_pair):
    """Load refuses a chained package whose target invoke leaves the seed output unbound."""
    def drop_seed(document: dict) -> None:
        for step in document["pipeline"]["workflow"]["steps"]:
            if step["kind"] == "invoke" and step["component"] == "target":
                del step["outputs"]["hidden_states"]

    with pytest.raises(MetadataError) as caught:
        speculant.load(edited_pair("no-seed-binding", drop_seed))
    assert "pipeline.workflow.steps.0.outputs.hidden_states" in caught.value.paths


# -- gaps: the spec asks for a ChainError, the runtime raises something else ---------------------
def test_carry_0_from_an_empty_seed_output(pair_engine, monkeypatch):
    engine = pair_engine()
    _patch_latest_seed(monkeypatch, engine,
                       lambda seed: Value.host(np.array(seed.data[:, :0]), seed.dtype))
    with pytest.raises(ChainError) as caught:
        _speculate(engine)
    assert "hidden_states" in str(caught.value)
