"""The draft model's rows drafted together (speculative/draft_rows.py, docs/design/batching.md
"The draft model's rows") on the tiny export pair and a tiny draft model, both written with
``batch=4``, CPU float32: each row's drafts, made in one batched draft pass per draft step
with the other rows', equal the drafts its request makes alone at the same consumed count
(greedy and seeded sampling, rows of k = 1, 2, 4 together, prompts in chunks, requests
joining as others leave), so outputs together equal outputs alone; each draft pass writes
only its rows' own slots; a planted defect (each row reading the next row's draft cursor) is
caught; a draft package without a batched graph, and a request under a grammar, keep the
draft model per row."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import speculant
from export.export_models import (
    CONFIG,
    DRAFT_CONFIG,
    DRAFT_WEIGHTS,
    DRAFTER_WEIGHTS,
    TARGET_WEIGHTS,
    write_tokenizer,
)
from speculant.errors import SpeculantError
from speculant.speculative import draft_rows
from speculant.speculative.draft_model import DraftModelProposer
from speculant.speculative.kinds import KINDS
from speculant.workflow.batched_pass import RowBlock
from speculant.workflow.cells import RowCells
from speculant.workflow.request import Request
from speculant_tools.export import write_decoder_package, write_pair_package

ROWS = 4
PROMPTS = [[7, 3, 41, 12], [9, 2, 5], [33, 48, 2, 17, 5, 6, 30, 11, 40, 9, 9, 9],
           [14, 8, 21, 3, 3], [22, 22, 22, 22, 22, 22, 22, 22, 22], [40, 41, 42, 40, 41, 42, 40],
           [5, 6]]
MAX_NEW = [10, 16, 8, 20, 12, 14, 18]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("draft_rows")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {"pair": write_pair_package(base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                                       tokenizer, graph="explicit", cache="static",
                                       batch=ROWS),
            "draft": write_decoder_package(base / "draft", DRAFT_WEIGHTS, DRAFT_CONFIG,
                                           tokenizer, cache="static", batch=ROWS),
            "draft_alone": write_decoder_package(base / "draft_alone", DRAFT_WEIGHTS,
                                                 DRAFT_CONFIG, tokenizer, cache="static")}


@pytest.fixture(scope="module")
def engine(roots) -> speculant.Engine:
    return speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS, prefill_chunk=3)


Drafts = dict[tuple[tuple[int, ...], int], list[int]]  # (prompt, C) -> the drafts proposed there


def record_drafts(monkeypatch) -> tuple[Drafts, Drafts, list[str]]:
    """Spy on both draft-model paths: the drafts proposed to each request at each consumed
    count ``C`` (``DraftRows.propose_rows``: rows drafted together;
    ``DraftModelProposer.propose``: batch 1, or a row drafted by itself), in the phase named
    by the last item of the returned list (``together`` or ``alone``)."""
    recorded: dict[str, Drafts] = {"together": {}, "alone": {}}
    phase = ["together"]
    propose_rows, propose = draft_rows.DraftRows.propose_rows, DraftModelProposer.propose

    def key(state) -> tuple[tuple[int, ...], int]:
        return tuple(state.tokens[:state.prompt_len]), state.consumed

    def spied_rows(self, requests):
        results = propose_rows(self, requests)
        for (state, _), result in zip(requests, results, strict=True):
            recorded[phase[-1]][key(state)] = list(result.tokens)
        return results

    def spied(self, state, k):
        result = propose(self, state, k)
        recorded[phase[-1]][key(state)] = list(result.tokens)
        return result

    monkeypatch.setattr(draft_rows.DraftRows, "propose_rows", spied_rows)
    monkeypatch.setattr(DraftModelProposer, "propose", spied)
    return recorded["together"], recorded["alone"], phase


def drafts_mismatches(engine: speculant.Engine, prompts: Sequence[Sequence[int]],
                      options: Sequence[dict], monkeypatch) -> tuple[list[str], int]:
    """Where a row's drafts, made with the other rows', differ from the drafts its request
    proposes alone at the same consumed count (the shorter a prefix of the longer: a round's
    k is its own), and how many proposals were compared; a request whose output together
    differs from alone, or that raised, is named too."""
    together, alone, phase = record_drafts(monkeypatch)
    found = []
    try:
        outputs = engine.generate_many(prompts, [speculant.GenerationOptions(**o)
                                                 for o in options])
    except SpeculantError as error:
        found.append(f"raised: {error}")
        outputs = [None] * len(prompts)
    phase.append("alone")
    for prompt, one, output in zip(prompts, options, outputs, strict=True):
        expected = engine.generate(list(prompt), **one)  # batch 1: its drafts are recorded
        if output is not None and output.token_ids != expected.token_ids:
            found.append(f"prompt {prompt}: {output.token_ids} != {expected.token_ids}")
    compared = 0
    for where, drafts in together.items():
        if where in alone:
            compared += 1
            n = min(len(drafts), len(alone[where]))
            if drafts[:n] != alone[where][:n]:
                found.append(f"prompt {list(where[0])} at C={where[1]}: {drafts} != "
                             f"{alone[where]}")
    return found, compared


@pytest.mark.parametrize("sampled", [False, True])
def test_each_draft_row_drafts_what_it_drafts_alone(engine, monkeypatch, sampled):
    """Every row's drafts, made in one batched draft pass per draft step with the other
    rows' (seven requests on four rows: rows joining as others leave, prompts in chunks of
    3, k = 1, 2 and 4 together), equal its batch-1 drafts at the same C, and every output
    equals its output alone."""
    sampling = {"temperature": 0.9, "seed": 5} if sampled else {}
    options = [{"max_new_tokens": n, "proposer": "draft", "k": (1, 2, 4)[i % 3], **sampling}
               for i, n in enumerate(MAX_NEW)]
    found, compared = drafts_mismatches(engine, PROMPTS, options, monkeypatch)
    assert found == [] and compared >= 40


def test_draft_rows_of_k_auto_equal_alone(engine):
    options = [speculant.GenerationOptions(max_new_tokens=n, proposer="draft", k="auto")
               for n in MAX_NEW]
    together = engine.generate_many(PROMPTS, options)
    for prompt, one, got in zip(PROMPTS, options, together, strict=True):
        assert got.token_ids == engine.generate(prompt, one).token_ids
        assert got.stats.rollback_bytes_moved == 0


def test_the_step_drafts_every_draft_row_in_one_pass_per_draft_step(engine, monkeypatch):
    """Four rows of k = 2, 4, 1, 4: the first step drafting all of them runs 4 passes, the
    first over every row (its catch-up), the later ones one token a row over the rows whose
    k reaches them (3, then 2, then 2); every step runs at most its widest k passes (rows
    whose prompt is consumed draft while the others still prefill)."""
    steps: list[list[list[int]]] = []  # per step, per draft pass: its rows' widths
    run = draft_rows.DraftRows._run

    def spied(self, blocks):
        steps[-1].append([len(block.tokens) for block in blocks])
        return run(self, blocks)

    monkeypatch.setattr(draft_rows.DraftRows, "_run", spied)
    handles = [engine.submit(prompt, max_new_tokens=12, proposer="draft", k=k)
               for prompt, k in zip(PROMPTS[:4], (2, 4, 1, 4), strict=True)]
    while not all(handle.is_finished for handle in handles):
        steps.append([])
        engine.scheduler.step()
    drafting = [passes for passes in steps if passes]
    every_row = [passes for passes in drafting if len(passes[0]) == 4]
    assert [[4, 3, 2, 2]] == [[len(rows) for rows in passes] for passes in every_row][:1]
    for passes in drafting:  # near their ends rows draft less (capped by max_new_tokens)
        sizes = [len(rows) for rows in passes]
        assert len(passes) <= 4 and sizes == sorted(sizes, reverse=True)
        assert all(rows == [1] * len(rows) for rows in passes[1:])


def snapshot(target) -> np.ndarray:
    """Every buffer's bytes, [cells, rows, ..., capacity, ...] (a copy)."""
    return np.stack([np.array(buffer.data) for buffer in target.buffers.values()])


def test_each_draft_pass_writes_only_its_rows_own_slots(roots, monkeypatch):
    """The draft's buffers filled with random values: after each draft pass, the slots that
    changed are each drafting row's block ``[D_b, D_b + W_b)``, nothing else (no free row,
    no padding tail, no other request's row)."""
    engine = speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS,
                            prefill_chunk=4)
    target = engine.draft_rows.target
    target.fit(128)
    for buffer in target.buffers.values():
        buffer.data[...] = np.random.default_rng(3).standard_normal(buffer.shape)
    found: list[str] = []
    num_passes = 0
    run = draft_rows.DraftRows._run

    def spied(self, blocks):
        nonlocal num_passes
        before = snapshot(self.target)
        results = run(self, blocks)
        num_passes += 1
        changed = (before != snapshot(self.target)).any(axis=(0, 2, 4))  # [rows, capacity]
        allowed = np.zeros_like(changed)
        for block in blocks:
            allowed[block.cells.row, block.start:block.start + len(block.tokens)] = True
        found.extend(f"row {row} slot {slot}"
                     for row, slot in zip(*np.nonzero(changed & ~allowed), strict=True))
        return results

    monkeypatch.setattr(draft_rows.DraftRows, "_run", spied)
    engine.generate_many(PROMPTS[:3], max_new_tokens=8, proposer="draft", k=3)
    assert num_passes > 10 and found == []


def test_planted_draft_row_reading_the_next_rows_cursor_is_caught(roots, monkeypatch):
    """Planted: each row's draft pass takes the next row's draft length as its cursor (its
    block written and read there): its drafts differ from alone."""
    engine = speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS,
                            prefill_chunk=4)
    run = draft_rows.DraftRows._run

    def next_rows_cursor(self, blocks):
        starts = [block.start for block in blocks]
        return run(self, [RowBlock(block.tokens, starts[(i + 1) % len(blocks)], block.cells)
                          for i, block in enumerate(blocks)])

    monkeypatch.setattr(draft_rows.DraftRows, "_run", next_rows_cursor)
    options = [{"max_new_tokens": n, "proposer": "draft", "k": 2} for n in MAX_NEW[:4]]
    found, compared = drafts_mismatches(engine, PROMPTS[:4], options, monkeypatch)
    assert compared > 0 and any(" at C=" in problem for problem in found)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_draft_package_without_a_batched_graph_keeps_its_rows_one_by_one(roots, monkeypatch,
                                                                           sampled):
    """No batched draft graph: each row's draft model has caches of its own (batch 1's
    proposer), and its drafts still equal alone — steps where another row prefills (no
    drafts verified) included, which commit past a rejected draft (``kept_length``)."""
    engine = speculant.load(roots["pair"], draft=roots["draft_alone"], max_batch=ROWS,
                            prefill_chunk=3)
    assert engine.draft_rows is None
    handle = engine.submit(PROMPTS[0], max_new_tokens=6, proposer="draft", k=2)
    assert isinstance(handle.entry.proposer, DraftModelProposer)
    handle.close()
    sampling = {"temperature": 0.9, "seed": 5} if sampled else {}
    options = [{"max_new_tokens": n, "proposer": "draft", "k": (1, 2, 4)[i % 3], **sampling}
               for i, n in enumerate(MAX_NEW)]
    found, compared = drafts_mismatches(engine, PROMPTS, options, monkeypatch)
    assert found == [] and compared >= 40


def test_a_request_under_a_grammar_drafts_by_itself(engine):
    """A grammar forces and masks drafts one by one (as alone): its row's draft model has
    caches of its own; the same request without one is a row of the draft's rows."""
    sources = dataclasses.replace(engine.proposer_sources, is_batched=True, row=RowCells(32),
                                  draft_rows=lambda: engine.draft_rows)
    options = speculant.GenerationOptions(max_new_tokens=4, proposer="draft", k=2)
    constrained = dataclasses.replace(options, grammar=speculant.Grammar.regex("[0-9]+"))
    assert isinstance(KINDS["draft"].build(sources, Request((7, 3), constrained), 2),
                      DraftModelProposer)
    assert KINDS["draft"].build(sources, Request((7, 3), options), 2) is engine.draft_rows


def test_a_draft_package_of_fewer_rows_than_the_scheduler_drafts_one_by_one(roots):
    engine = speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS)
    assert isinstance(engine.draft_rows, draft_rows.DraftRows)
    assert not draft_rows.can_draft_rows(engine.draft, ROWS + 1)


def test_a_leaving_request_releases_its_draft_row(roots):
    engine = speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS)
    handles = engine.submit_many(PROMPTS[:3], max_new_tokens=4, proposer="draft", k=2)
    assert len(engine.draft_rows.rows) == 3
    assert all(isinstance(handle.entry.proposer, draft_rows.DraftRows) for handle in handles)
    while engine.scheduler.has_work:
        engine.scheduler.step()
    del handles
    gc.collect()
    assert len(engine.draft_rows.rows) == 0


def test_a_request_beyond_the_drafts_capacity_is_refused_with_the_numbers(roots, tmp_path):
    """A draft of 32 positions beside a target of 64: a request the target's row holds but
    the draft's does not is refused at admission, as alone."""
    short = write_decoder_package(tmp_path / "short", DRAFT_WEIGHTS, dataclasses.replace(
        DRAFT_CONFIG, max_position_embeddings=32), roots["pair"] / "tokenizer.json",
                                  cache="static", batch=ROWS)
    engine = speculant.load(roots["pair"], draft=short, max_batch=ROWS)
    for submit in (engine.submit, engine.generate):
        with pytest.raises(speculant.RequestError) as caught:
            submit(PROMPTS[0], max_new_tokens=30, proposer="draft", k=2)
        assert "draft model's request needs 37 cache slots" in str(caught.value)
    assert not engine.scheduler.has_work
