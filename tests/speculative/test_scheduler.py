"""The scheduler (speculative/scheduler.py, docs/design/batching.md "The scheduler") on the
tiny export pair written with ``batch=4``, CPU float32: each request's output decoded with
others equals its output alone (engine.generate, batch 1) token for token — for every
proposer (the chained drafter's and the draft model's rows drafted together: the draft
package is written with ``batch=4`` too) and k, with prompts in chunks, requests joining and
leaving mid-decode, stop strings, cancellation, seeded sampling and randomised arrival
schedules; each chained row drafts what it drafts alone (each draft-model row:
test_draft_rows.py). Each pass writes
only its rows' valid slots. Planted defects (a cursor from another row, padding written, a
stale length after a rollback, a finished row still counted, a chained row drafting from
another row's cache) are each caught by the check named in their test."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import speculant
from export.export_models import (
    CONFIG,
    DRAFT_CONFIG,
    DRAFT_WEIGHTS,
    DRAFTER_WEIGHTS,
    TARGET_WEIGHTS,
    write_tokenizer,
)
from speculant.errors import AdmissionError, RequestError, SpeculantError
from speculant.speculative import chain_rows
from speculant.speculative import scheduler as scheduler_module
from speculant.speculative.chained import ChainedProposer
from speculant.speculative.step_width import StepCosts, StepWidth
from speculant.speculative.width import WidthTable
from speculant.tensors import Value
from speculant.tensors.seam import TensorSeam
from speculant.workflow import batched_pass
from speculant_tools.export import write_decoder_package, write_pair_package

ROWS = 4
# prompts of different lengths (more than ROWS: some wait for a row), their max_new_tokens
PROMPTS = [[7, 3, 41, 12], [9, 2, 5], [33, 48, 2, 17, 5, 6, 30, 11, 40, 9, 9, 9],
           [14, 8, 21, 3, 3], [22, 22, 22, 22, 22, 22, 22, 22, 22], [40, 41, 42, 40, 41, 42, 40],
           [5, 6]]
MAX_NEW = [10, 16, 8, 20, 12, 14, 18]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("scheduler")
    tokenizer = write_tokenizer(base / "tokenizer.json")
    return {"pair": write_pair_package(base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                                       tokenizer, graph="explicit", cache="static",
                                       batch=ROWS),
            "draft": write_decoder_package(base / "draft", DRAFT_WEIGHTS, DRAFT_CONFIG,
                                           tokenizer, cache="static", batch=ROWS),
            "plain": write_pair_package(base / "plain", TARGET_WEIGHTS, CONFIG,
                                        DRAFTER_WEIGHTS, tokenizer, graph="explicit",
                                        cache="static")}


@pytest.fixture(scope="module")
def engines(roots) -> Callable[..., speculant.Engine]:
    """``engines(rows, chunk)``: one engine with the draft model per scheduler shape."""
    made: dict[tuple[int, int], speculant.Engine] = {}

    def get(rows: int = ROWS, chunk: int = 128) -> speculant.Engine:
        if (rows, chunk) not in made:
            made[rows, chunk] = speculant.load(roots["pair"], draft=roots["draft"],
                                               max_batch=rows, prefill_chunk=chunk)
        return made[rows, chunk]

    return get


ALONE: dict[tuple, speculant.Generation] = {}


def alone(engine: speculant.Engine, prompt: Sequence[int] | str, **options
          ) -> speculant.Generation:
    """The request decoded by itself (engine.generate: batch 1, the decode loop)."""
    key = (tuple(prompt) if not isinstance(prompt, str) else prompt,
           tuple(sorted(options.items())))
    if key not in ALONE:
        ALONE[key] = engine.generate(list(prompt) if not isinstance(prompt, str) else prompt,
                                     **options)
    return ALONE[key]


def mismatches(engine: speculant.Engine, prompts: Sequence[Sequence[int]],
               options: Sequence[dict]) -> list[int]:
    """The indices of the requests whose output decoded together (generate_many) differs
    from their output alone; every index where decoding together raised."""
    from speculant.workflow.options import GenerationOptions

    try:
        together = engine.generate_many(prompts, [GenerationOptions.of(**o) for o in options])
    except SpeculantError:
        return list(range(len(prompts)))
    return [i for i, (prompt, one, got) in enumerate(zip(prompts, options, together,
                                                         strict=True))
            if got.token_ids != alone(engine, prompt, **one).token_ids]


GREEDY_CASES = [(None, None), *[(proposer, k) for proposer in ("prompt_lookup", "draft",
                                                                 "chained", "lookup_chained")
                                 for k in (1, 2, 4, "auto")]]


@pytest.mark.parametrize(("rows", "chunk"), [(ROWS, 128), (3, 3)])
@pytest.mark.parametrize(("proposer", "k"), GREEDY_CASES)
def test_each_request_decoded_together_equals_its_output_alone(engines, rows, chunk,
                                                               proposer, k):
    engine = engines(rows, chunk)
    options = [{"max_new_tokens": n, "proposer": proposer, "k": k} for n in MAX_NEW]
    assert mismatches(engine, PROMPTS, options) == []
    if proposer is not None and k != "auto":  # speculation ran, and rolled back
        stats = [g.stats for g in engine.generate_many(PROMPTS[:3], [
            speculant.GenerationOptions(**o) for o in options[:3]])]
        assert sum(s.rounds for s in stats) > 0
        assert all(s.rollback_bytes_moved == 0 for s in stats)


def test_lookup_chained_rows_draft_alone_or_with_the_chained_rows(engines, monkeypatch):
    """``lookup_chained`` decoded together: a row whose last 2 or 3 tokens recur drafts its
    lookup continuation itself, every other row is drafted with the step's chained rows
    (``ChainRows.propose_rows``); both happen, and each request equals its output alone."""
    from speculant.speculative.lookup_chained import LookupChainedProposer

    engine = engines()
    options = [{"max_new_tokens": n, "proposer": "lookup_chained", "k": 4} for n in MAX_NEW]
    for prompt, one in zip(PROMPTS, options, strict=True):
        alone(engine, prompt, **one)  # batch 1 first: the spies below see the scheduler only
    seen = {"lookup": 0, "chained rows": 0}
    ahead, rows = LookupChainedProposer.propose_ahead, chain_rows.ChainRows.propose_rows

    def spy_ahead(self, state, k):
        found = ahead(self, state, k)
        seen["lookup"] += found is not None
        return found

    def spy_rows(self, requests):
        seen["chained rows"] += len(requests)
        return rows(self, requests)

    monkeypatch.setattr(LookupChainedProposer, "propose_ahead", spy_ahead)
    monkeypatch.setattr(chain_rows.ChainRows, "propose_rows", spy_rows)
    assert mismatches(engine, PROMPTS, options) == []
    assert seen["lookup"] > 0 and seen["chained rows"] > 0, seen


# -- the chained drafter steps its rows together (chain_rows.py) -----------------------------
Drafts = dict[tuple[tuple[int, ...], int], list[int]]  # (prompt, C) -> the drafts proposed there


def record_drafts(monkeypatch) -> tuple[Drafts, Drafts]:
    """Spy on both chained paths: the drafts each request was proposed at each consumed
    count ``C``, decoded together (``ChainRows.propose_rows``) and alone
    (``ChainedProposer.propose``, batch 1)."""
    together: Drafts = {}
    alone_drafts: Drafts = {}
    propose_rows, propose = chain_rows.ChainRows.propose_rows, ChainedProposer.propose

    def key(state) -> tuple[tuple[int, ...], int]:
        return tuple(state.tokens[:state.prompt_len]), state.consumed

    def spied_rows(self, requests):
        before = snapshot(self.target)
        results = propose_rows(self, requests)
        assert (snapshot(self.target) == before).all(), "the drafter wrote a borrowed cache"
        for (state, _), result in zip(requests, results, strict=True):
            together[key(state)] = list(result.tokens)
        return results

    def spied(self, state, k):
        result = propose(self, state, k)
        alone_drafts[key(state)] = list(result.tokens) if result.drafts is None else \
            np.asarray(result.drafts.data).tolist()
        return result

    monkeypatch.setattr(chain_rows.ChainRows, "propose_rows", spied_rows)
    monkeypatch.setattr(ChainedProposer, "propose", spied)
    return together, alone_drafts


def drafts_mismatches(engine: speculant.Engine, prompts: Sequence[Sequence[int]],
                      options: Sequence[dict], monkeypatch) -> tuple[list[str], int]:
    """Where a row's drafts, made with the other rows', differ from the drafts its request
    proposes alone at the same consumed count (the shorter one a prefix of the longer: a
    chain is cut at its k), and how many proposals were compared. Each row must read its own
    row of the borrowed caches, at its own length, for these to agree."""
    together, alone_drafts = record_drafts(monkeypatch)
    engine.generate_many(prompts, [speculant.GenerationOptions(**o) for o in options])
    for prompt, one in zip(prompts, options, strict=True):
        engine.generate(list(prompt), **one)  # not the cache: its drafts are recorded
    found, compared = [], 0
    for where, drafts in together.items():
        if where in alone_drafts:
            compared += 1
            expected = alone_drafts[where]
            n = min(len(drafts), len(expected))
            if drafts[:n] != expected[:n]:
                found.append(f"prompt {list(where[0])} at C={where[1]}: {drafts} != {expected}")
    return found, compared


@pytest.mark.parametrize("sampled", [False, True])
def test_each_chained_row_drafts_what_it_drafts_alone(engines, monkeypatch, sampled):
    """Every row's drafts made in the step's one drafter run per draft equal its batch-1
    drafts at the same C, rows of different k (1, 2, 4) and lengths stepping together."""
    engine = engines(ROWS, 3)
    sampling = {"temperature": 0.9, "seed": 5} if sampled else {}
    options = [{"max_new_tokens": n, "proposer": "chained", "k": (1, 2, 4)[i % 3], **sampling}
               for i, n in enumerate(MAX_NEW)]
    found, compared = drafts_mismatches(engine, PROMPTS, options, monkeypatch)
    assert found == [] and compared >= 40


@pytest.mark.parametrize("form", ["fused", "subset"])
def test_each_chained_row_drafts_what_it_drafts_alone_in_other_drafter_forms(
        roots, tmp_path, monkeypatch, form):
    """The fused drafter graph (ONNX Attention, ``cache_lengths`` as ``nonpad_kv_seqlen``)
    and a subset vocabulary (the drafter scores the first 30 ids): rows equal alone."""
    config = dataclasses.replace(CONFIG, draft_vocab_size=30) if form == "subset" else CONFIG
    root = write_pair_package(tmp_path / form, TARGET_WEIGHTS, config, DRAFTER_WEIGHTS,
                              roots["pair"] / "tokenizer.json", cache="static", batch=ROWS,
                              graph="fused" if form == "fused" else "explicit")
    engine = speculant.load(root, max_batch=3, prefill_chunk=5)
    options = [{"max_new_tokens": n, "proposer": "chained", "k": (4, 2, 1)[i % 3]}
               for i, n in enumerate(MAX_NEW)]
    assert mismatches(engine, PROMPTS, options) == []
    found, compared = drafts_mismatches(engine, PROMPTS, options, monkeypatch)
    assert found == [] and compared >= 40


@pytest.mark.parametrize("defect", ["cache_lengths of the next row", "row index swapped"])
def test_planted_drafter_reading_another_rows_cache_is_caught(roots, monkeypatch, defect):
    """Planted: each row's drafter step reads the next row's length, or its token and carry
    run in the next row (that row's cache at that row's length): the drafts differ."""
    engine = speculant.load(roots["pair"], max_batch=ROWS, prefill_chunk=4)
    if defect.startswith("cache_lengths"):
        filled = chain_rows.ChainRows._filled
        monkeypatch.setattr(chain_rows.ChainRows, "_filled",
                            lambda self, lengths: filled(self, np.roll(lengths, 1)))
    else:
        run = chain_rows.ChainRows._run

        def swapped(self, session, fixed, tokens, carry, outputs):
            rolled = Value.host(np.roll(np.asarray(carry.data), 1, axis=0), carry.dtype)
            return run(self, session, fixed, np.roll(tokens, 1), rolled, outputs)

        monkeypatch.setattr(chain_rows.ChainRows, "_run", swapped)
    options = [{"max_new_tokens": n, "proposer": "chained", "k": 2} for n in MAX_NEW[:4]]
    found, compared = drafts_mismatches(engine, PROMPTS[:4], options, monkeypatch)
    assert compared > 0 and found != []


def test_chained_rows_join_and_leave_mid_decode(engines, monkeypatch):
    """Chained requests arriving while others decode (their prompts in chunks beside the
    decoding rows) each equal their output alone, and draft what they draft alone."""
    engine = engines(3, 3)
    together, alone_drafts = record_drafts(monkeypatch)
    options = [{"max_new_tokens": n, "proposer": "chained", "k": k}
               for n, k in zip(MAX_NEW, (2, 4, 1, "auto", 2, 4, 1), strict=True)]
    handles = [engine.submit(PROMPTS[0], **options[0])]
    for prompt, one in zip(PROMPTS[1:], options[1:], strict=True):
        for _ in range(2):
            engine.scheduler.step()
        handles.append(engine.submit(prompt, **one))
    outputs = [list(handle) for handle in handles]
    for prompt, one, tokens in zip(PROMPTS, options, outputs, strict=True):
        assert tokens == engine.generate(prompt, **one).token_ids
    compared = [where for where in together if where in alone_drafts]
    assert len(compared) >= 20
    for where in compared:
        n = min(len(together[where]), len(alone_drafts[where]))
        assert together[where][:n] == alone_drafts[where][:n]
    assert not engine.scheduler.has_work


@pytest.mark.parametrize("proposer", ["chained", "prompt_lookup"])
def test_decoding_rows_verify_drafts_in_steps_where_a_row_prefills(engines, monkeypatch,
                                                                   proposer):
    """A request joining in chunks of 3 does not stop the decoding rows' speculation: in the
    steps that hold its prompt they still draft and verify (their passes are the decoding
    rows', or inside the chunk's width), and every output equals alone."""
    engine = engines(3, 3)
    seen = []  # per decoding row's round: (another row prefilled in its step, its k)
    fill = scheduler_module.Rounds.fill

    def spied(self, target, k, drafted):
        rows = [entry for entry in engine.scheduler.rows if entry is not None]
        seen.append((any(entry.is_prefilling for entry in rows), k or 0))
        return fill(self, target, k, drafted)

    monkeypatch.setattr(scheduler_module.Rounds, "fill", spied)
    options = {"max_new_tokens": 16, "proposer": proposer, "k": 2, "stop_on_eos": False}
    handles = [engine.submit(PROMPTS[0], **options)]
    for _ in range(4):
        engine.scheduler.step()
    handles += [engine.submit(prompt, **options) for prompt in PROMPTS[1:3]]
    outputs = [list(handle) for handle in handles]
    assert any(prefilling and k > 0 for prefilling, k in seen)
    monkeypatch.setattr(scheduler_module.Rounds, "fill", fill)
    for prompt, tokens in zip(PROMPTS, outputs, strict=False):
        assert tokens == engine.generate(prompt, **options).token_ids


@pytest.mark.parametrize("runner", [{}, {"proposer": "prompt_lookup", "k": 2},
                                    {"proposer": "chained", "k": 2}])
def test_a_step_reduces_its_rows_scores_to_token_ids_once(engines, monkeypatch, runner):
    """Greedy rows decoded together share one argmax (and one read-back) of the step's
    batched pass, not one a row; their outputs equal alone."""
    engine = engines(4, 128)
    calls = []
    argmax_rows = TensorSeam.argmax_rows

    def counted(self, x):
        calls.append(x.shape)
        return argmax_rows(self, x)

    options = {"max_new_tokens": 12, "stop_on_eos": False, **runner}
    handles = [engine.submit(prompt, **options) for prompt in PROMPTS[:4]]
    while any(entry is None or entry.is_prefilling for entry in engine.scheduler.rows):
        engine.scheduler.step()
    monkeypatch.setattr(TensorSeam, "argmax_rows", counted)
    steps = 0
    while all(entry is not None for entry in engine.scheduler.rows) and steps < 4:
        calls.clear()
        engine.scheduler.step()
        steps += 1
        # one [4, W, V] reduction for the step; none of a row's [1, W_b, V] alone
        assert [shape[0] for shape in calls if len(shape) == 3] == [4], calls
    assert steps > 0
    monkeypatch.setattr(TensorSeam, "argmax_rows", argmax_rows)
    for prompt, handle in zip(PROMPTS[:4], handles, strict=True):
        assert list(handle) == engine.generate(prompt, **options).token_ids


def test_requests_join_and_leave_mid_decode_with_their_own_stop_rules(engines):
    """Requests arrive while others decode; each keeps its own max_new_tokens, stop string
    and EOS rule, and equals its output alone (token ids, text, finish reason)."""
    engine = engines()
    texts = ["0123", "abc", "9:;<=", "ABAB", "@@@"]
    full = [alone(engine, text, max_new_tokens=12, stop_on_eos=False) for text in texts]
    stops = [full[0].text[3:5], (), full[2].text[1:3], (), full[4].text[5:6]]
    options = [{"max_new_tokens": 12, "stop": stop, "stop_on_eos": False,
                "proposer": "prompt_lookup", "k": 2} for stop in stops]
    handles = [engine.submit_stream(texts[0], **options[0]),
               engine.submit_stream(texts[1], **options[1])]
    for text, one in zip(texts[2:], options[2:], strict=True):
        for _ in range(3):  # the earlier requests decode a few steps first
            engine.scheduler.step()
        handles.append(engine.submit_stream(text, **one))
    pieces = [list(handle) for handle in handles]
    for text, one, handle, streamed in zip(texts, options, handles, pieces, strict=True):
        expected, got = alone(engine, text, **one), handle.result
        assert got.token_ids == expected.token_ids
        assert got.text == expected.text == "".join(streamed)
        assert got.finish_reason == expected.finish_reason
    assert {h.result.stats.stop_reason for h in handles} == {"stop_string", "max_new_tokens"}
    assert not engine.scheduler.has_work


def test_a_cancelled_request_stops_mid_stream_and_frees_its_row(engines):
    engine = engines()
    handles = [engine.submit(prompt, max_new_tokens=n, proposer="prompt_lookup", k=2)
               for prompt, n in zip(PROMPTS[:3], MAX_NEW[:3], strict=True)]
    cancelled = handles[1]
    taken = [next(cancelled) for _ in range(3)]
    cancelled.close()
    row_of = {id(entry): row for row, entry in enumerate(engine.scheduler.rows) if entry}
    assert id(cancelled.entry) in row_of
    engine.scheduler.step()
    assert cancelled.entry not in engine.scheduler.rows and cancelled.is_finished
    passes = cancelled.stats.target_passes
    rest = [list(handle) for handle in (handles[0], handles[2])]
    expected = alone(engine, PROMPTS[1], max_new_tokens=MAX_NEW[1], proposer="prompt_lookup",
                     k=2).token_ids
    result = cancelled.result
    assert result.token_ids[:3] == taken == expected[:3]
    assert result.token_ids == expected[:len(result.token_ids)]
    assert result.stats.stop_reason == "closed" and cancelled.stats.target_passes == passes
    assert list(cancelled) == []
    for prompt, n, tokens in zip((PROMPTS[0], PROMPTS[2]), (MAX_NEW[0], MAX_NEW[2]), rest,
                                 strict=True):
        assert tokens == alone(engine, prompt, max_new_tokens=n, proposer="prompt_lookup",
                               k=2).token_ids


@pytest.mark.parametrize("proposer", [None, "prompt_lookup", "draft", "chained"])
def test_seeded_sampling_draws_the_same_tokens_together_as_alone(engines, proposer):
    engine = engines(3, 4)
    options = [{"max_new_tokens": n, "temperature": 0.9, "top_p": 0.95, "seed": 11 + i,
                "proposer": proposer, "k": 2 if proposer else None}
               for i, n in enumerate(MAX_NEW)]
    assert mismatches(engine, PROMPTS, options) == []
    differs = engine.generate_many(PROMPTS[:2], [speculant.GenerationOptions(
        max_new_tokens=16, temperature=0.9, seed=s) for s in (1, 2)])
    assert differs[0].token_ids != alone(engine, PROMPTS[0], max_new_tokens=16,
                                         temperature=0.9, seed=2).token_ids


def test_prompt_logprobs_are_recorded_chunk_by_chunk_as_alone(engines):
    """Prompts prefilled in chunks of 3 beside decoding rows: each chunk's rows give the
    log-probabilities of the prompt tokens after them, the whole prompt's equal to alone."""
    engine = engines(3, 3)
    options = speculant.GenerationOptions(max_new_tokens=6, prompt_logprobs=True, logprobs=1,
                                          proposer="prompt_lookup", k=2)
    together = engine.generate_many(PROMPTS, options)
    for prompt, got in zip(PROMPTS, together, strict=True):
        expected = alone(engine, prompt, max_new_tokens=6, prompt_logprobs=True, logprobs=1,
                         proposer="prompt_lookup", k=2)
        assert len(got.prompt_logprobs) == len(prompt) and got.prompt_logprobs[0] is None
        assert [t.token for t in got.prompt_logprobs[1:]] == list(prompt[1:])
        np.testing.assert_allclose([t.logprob for t in got.prompt_logprobs[1:]],
                                   [t.logprob for t in expected.prompt_logprobs[1:]],
                                   atol=1e-4)
        assert got.token_ids == expected.token_ids


def test_logprobs_are_recorded_per_request_as_alone(engines):
    engine = engines(3, 4)
    options = speculant.GenerationOptions(max_new_tokens=8, logprobs=2,
                                          proposer="prompt_lookup", k=2)
    together = engine.generate_many(PROMPTS[:4], options)
    for prompt, got in zip(PROMPTS[:4], together, strict=True):
        expected = alone(engine, prompt, max_new_tokens=8, logprobs=2,
                         proposer="prompt_lookup", k=2)
        assert [t.token for t in got.logprobs] == got.token_ids == expected.token_ids
        np.testing.assert_allclose([t.logprob for t in got.logprobs],
                                   [t.logprob for t in expected.logprobs], atol=1e-4)
        assert [[i for i, _ in t.top] for t in got.logprobs] == \
            [[i for i, _ in t.top] for t in expected.logprobs]


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrivals=st.lists(st.tuples(st.integers(0, 12), st.integers(0, len(PROMPTS) - 1),
                                   st.integers(1, 14),
                                   st.sampled_from([None, "prompt_lookup", "chained"])),
                         min_size=1, max_size=8),
       rows=st.integers(1, ROWS), chunk=st.sampled_from([2, 5, 128]))
@example(arrivals=[(0, 0, 1, None), (0, 0, 1, "prompt_lookup")], rows=1, chunk=2)
def test_randomised_arrival_schedules_keep_every_output(engines, arrivals, rows, chunk):
    """Requests submitted at random steps (several in one step, some while every row is
    busy) each equal their output alone; every request ends and frees its row."""
    engine = engines(rows, chunk)
    scheduler = engine.scheduler
    handles, step = [], 0
    pending = sorted(arrivals, key=lambda arrival: arrival[0])  # by step, then as listed
    while pending or scheduler.has_work:
        while pending and pending[0][0] <= step:
            _, index, n, proposer = pending.pop(0)
            handles.append((index, n, proposer, engine.submit(
                PROMPTS[index], max_new_tokens=n, proposer=proposer, k=2 if proposer else None)))
        scheduler.step()
        step += 1
        assert step < 500
    for index, n, proposer, handle in handles:
        expected = alone(engine, PROMPTS[index], max_new_tokens=n, proposer=proposer,
                         k=2 if proposer else None)
        assert list(handle) == handle.result.token_ids == expected.token_ids
    assert scheduler.rows == [None] * rows


# -- what each pass writes, and the planted defects -------------------------------------------
def snapshot(target: batched_pass.BatchedTargetPass) -> np.ndarray:
    """Every cache buffer's bytes, [cells, rows, ..., capacity, ...] (a copy)."""
    return np.stack([np.array(buffer.data) for buffer in target.buffers.values()])


def checked_writes(engine: speculant.Engine, monkeypatch) -> list[str]:
    """Spy on the batched pass: after every pass, the slots of each row that changed outside
    ``[L_b, L_b + W_b)`` (its block, at its state's cursor) — a free row: anywhere."""
    target = engine.scheduler.target
    for buffer in target.buffers.values():  # random bytes: any write shows
        buffer.data[...] = np.random.default_rng(3).standard_normal(buffer.shape)
    found: list[str] = []
    run = batched_pass.BatchedTargetPass.run

    def spied(self, blocks):
        before = snapshot(self)
        results = run(self, blocks)
        changed = (before != snapshot(self)).any(axis=(0, 2, 4))  # [rows, capacity]
        allowed = np.zeros_like(changed)
        for block in blocks:
            allowed[block.cells.row, block.start:block.start + len(block.tokens)] = True
        for row, slot in zip(*np.nonzero(changed & ~allowed), strict=True):
            found.append(f"row {row} slot {slot}")
        return results

    monkeypatch.setattr(batched_pass.BatchedTargetPass, "run", spied)
    return found


@pytest.fixture
def fresh_engine(roots) -> speculant.Engine:
    """An engine of its own (a planted defect never reaches the shared ones)."""
    return speculant.load(roots["pair"], max_batch=ROWS, prefill_chunk=4)


@pytest.mark.parametrize("proposer", ["prompt_lookup", "chained"])
def test_each_pass_writes_only_its_rows_valid_slots(fresh_engine, monkeypatch, proposer):
    found = checked_writes(fresh_engine, monkeypatch)
    fresh_engine.generate_many(PROMPTS[:3], max_new_tokens=8, proposer=proposer, k=2)
    assert found == []


def test_planted_padding_written_is_caught(fresh_engine, monkeypatch):
    """block_lengths = W for every row: the free row and the short rows' padding written."""
    monkeypatch.setattr(batched_pass, "row_widths",
                        lambda blocks, rows, width, first=0: np.full(rows, width, np.int64))
    found = checked_writes(fresh_engine, monkeypatch)
    fresh_engine.generate_many(PROMPTS[:3], max_new_tokens=8, proposer="prompt_lookup", k=2)
    assert any(f.startswith("row 3 ") for f in found)  # the free row
    assert len({f.split(" slot")[0] for f in found}) >= 2


def test_planted_cursor_of_another_row_is_caught(fresh_engine, monkeypatch):
    """Each row's block written and read at the next row's cursor: the drafts are verified
    against another row's cache."""
    cursors = batched_pass.row_cursors
    monkeypatch.setattr(batched_pass, "row_cursors",
                        lambda blocks, rows, first=0: np.roll(cursors(blocks, rows, first), 1))
    options = [{"max_new_tokens": n, "proposer": "prompt_lookup", "k": 2} for n in MAX_NEW]
    assert mismatches(fresh_engine, PROMPTS[:4], options[:4]) != []


def test_planted_stale_length_after_a_rollback_is_caught(fresh_engine, monkeypatch):
    """A row's cursor kept by the scheduler (start + the block's width), not taken from its
    state's consumed count: after a rollback it is stale."""
    options = [{"max_new_tokens": n, "proposer": "prompt_lookup", "k": 4} for n in MAX_NEW]
    together = fresh_engine.generate_many(PROMPTS[:4], [speculant.GenerationOptions(**o)
                                                        for o in options[:4]])
    assert sum(g.stats.rollbacks for g in together) > 0  # the defect has something to spoil
    ends: dict[int, int] = {}
    run = scheduler_module.StepBatch.run

    def stale(self, tokens, start, cells, admitted, controls, **kwargs):
        start = ends.get(id(cells), start)
        ends[id(cells)] = start + len(tokens)
        return run(self, tokens, start, cells, admitted, controls, **kwargs)

    monkeypatch.setattr(scheduler_module.StepBatch, "run", stale)
    assert mismatches(fresh_engine, PROMPTS[:4], options[:4]) != []


def passes_after_finishing(engine: speculant.Engine, max_steps: int = 200) -> list[str]:
    """Drive three requests by :meth:`step`; what a finished request did afterwards: its
    row in a later pass, its counters changed."""
    scheduler = engine.scheduler
    handles = [engine.submit(p, max_new_tokens=n) for p, n in zip(PROMPTS[:3], (3, 9, 14),
                                                                 strict=True)]
    found, finished = [], {}
    for _ in range(max_steps):
        if all(h.is_finished for h in handles):
            break
        rows_before = {id(e): e for e in scheduler.rows if e is not None}
        scheduler.step()
        for i, handle in enumerate(handles):
            if i in finished:
                if id(handle.entry) in rows_before:
                    found.append(f"request {i} still in a row")
                if handle.stats.target_passes != finished[i]:
                    found.append(f"request {i} counted after it finished")
            elif handle.state.is_stopped:
                finished[i] = handle.stats.target_passes
    return found


def test_a_finished_row_leaves_and_is_never_counted_again(fresh_engine):
    assert passes_after_finishing(fresh_engine) == []


def test_planted_finished_row_still_counted_is_caught(fresh_engine, monkeypatch):
    def keeps_rows(self):  # ends stopped requests but leaves them in their rows
        for entry in self.rows:
            if entry is not None and entry.state.is_stopped and not entry.is_done:
                self._end(entry)

    monkeypatch.setattr(scheduler_module.Scheduler, "_leave", keeps_rows)
    found = passes_after_finishing(fresh_engine, max_steps=40)
    assert any("still in a row" in f for f in found)
    assert any("counted after it finished" in f for f in found)


# -- k by load: the step's width from the measured cost of a [B, W] pass ---------------------
class FrozenCosts(StepCosts):
    """A cost table the steps cannot move: ``t_pass(n, W) = 1 + slope[n] × (W − 1)`` for a
    pass running ``n`` rows, proposals and the time outside free."""

    def __init__(self, slope: dict[int, float]) -> None:
        super().__init__()
        for rows, per_token in slope.items():
            self.passes[rows] = WidthTable({w: 1.0 + per_token * (w - 1) for w in range(1, 17)})

    def observe_pass(self, num_rows: int, width: int, seconds: float, step: int = 0) -> None:
        pass

    def observe_proposal(self, kind: str, k: int, seconds: float, *,
                         is_together: bool = False) -> None:
        pass

    def observe_outside(self, num_rows: int, seconds: float) -> None:
        pass


def test_k_by_load_shrinks_to_greedy_as_rows_join_and_returns_as_they_leave(roots,
                                                                            monkeypatch):
    """A wider pass free where the pass runs 1 or 2 rows and dear at 4: a k="auto" request
    drafts its widest alone, every row verifies no drafts while three others decode beside
    it, speculation comes back as they leave; each output equals its output alone."""
    engine = speculant.load(roots["pair"], draft=roots["draft"], max_batch=ROWS)
    scheduler = engine.scheduler
    scheduler.widths = StepWidth(FrozenCosts({1: 0.0, 2: 0.0, 4: 10.0}))
    steps: list[dict] = []  # per decoding step: rows run, W chosen, the widest cap, pass's W
    choose, run = scheduler.widths.choose, batched_pass.BatchedTargetPass.run

    def chosen(rows, num_run):
        steps.append({"run": num_run, "W": choose(rows, num_run),
                      "cap": max(cap for _, cap, _ in rows)})
        return steps[-1]["W"]

    def passed(self, blocks):
        if steps and "pass" not in steps[-1]:
            steps[-1]["pass"] = max(len(block.tokens) for block in blocks)
        return run(self, blocks)

    monkeypatch.setattr(scheduler.widths, "choose", chosen)
    monkeypatch.setattr(batched_pass.BatchedTargetPass, "run", passed)
    asked = [(PROMPTS[0], 40), (PROMPTS[1], 6), (PROMPTS[3], 8), (PROMPTS[6], 10)]
    handles = [engine.submit(PROMPTS[0], max_new_tokens=40, proposer="draft", k="auto")]
    for _ in range(4):  # a prefill, then three steps alone
        scheduler.step()
    handles += [engine.submit(p, max_new_tokens=n, proposer="draft", k="auto")
                for p, n in asked[1:]]
    while scheduler.has_work:
        scheduler.step()
    alone_first = [s for s in steps[:3] if s["run"] == 1]
    crowded = [s for s in steps if s["run"] == 4]
    left = [s for s in steps[3:] if s["run"] <= 2 and s["cap"]]
    assert len(alone_first) == 3 and all(s["W"] == 1 + s["cap"] > 1 for s in alone_first)
    assert crowded and all(s["W"] == 1 and s["pass"] == 1 for s in crowded)
    assert left and all(s["W"] == 1 + s["cap"] for s in left)
    assert any(s["pass"] > 1 for s in left)  # drafts verified again
    batch_1 = engine.proposer_sources.costs  # k="auto" alone: its costs, untouched here
    assert batch_1.propose == {} and batch_1.round_seconds == 0.0
    for (prompt, n), handle in zip(asked, handles, strict=True):
        assert handle.result.token_ids == alone(engine, prompt, max_new_tokens=n,
                                                proposer="draft", k="auto").token_ids


# -- refusals ---------------------------------------------------------------------------------
def test_a_drafter_whose_rows_cannot_step_together_is_refused_by_field():
    """A fused port whose request axis is not its first: no B-row step graph (a ChainError
    naming the field); its batch-1 step is unchanged."""
    from types import SimpleNamespace

    from speculant.errors import ChainError
    from speculant.package.model import TensorContract
    from speculant.speculative.chain_graph import step_prefix

    fused = TensorContract.model_validate({
        "dtype": "float32", "shape": ["sequence", "batch", 32],
        "batch_layout": {"kind": "request_aligned", "axis": 1}})
    chain = SimpleNamespace(fused_port="inputs_embeds", position_symbol="sequence")
    with pytest.raises(ChainError) as caught:
        step_prefix(fused, chain, rows=True)
    problem = caught.value.problems[0]
    assert problem.path == "speculative.proposal_execution.token_embedding_input"
    assert "engine.generate" in problem.remedy
    assert step_prefix(fused, chain) == (1, 1)


def test_a_failed_drafter_run_ends_its_chained_rows_alone(fresh_engine, monkeypatch):
    """ONNX Runtime failing the rows' drafter run: a ChainError for each chained row of
    the step; a prompt-lookup row beside them decodes on, equal to alone."""
    from speculant.errors import ChainError

    rows = fresh_engine.chain_rows

    def broken(*args, **kwargs):
        raise RuntimeError("planted: ORT failed the drafter")

    monkeypatch.setattr(rows.session, "invoke", broken)
    handles = [fresh_engine.submit(PROMPTS[i], max_new_tokens=8, proposer=proposer, k=2)
               for i, proposer in enumerate(("chained", "prompt_lookup", "chained"))]
    assert list(handles[1]) == alone(fresh_engine, PROMPTS[1], max_new_tokens=8,
                                     proposer="prompt_lookup", k=2).token_ids
    for i in (0, 2):
        with pytest.raises(ChainError, match="planted: ORT failed the drafter"):
            list(handles[i])
        assert handles[i].state.stop_reason == "error"
    assert not fresh_engine.scheduler.has_work


def test_a_request_beyond_a_rows_capacity_is_refused_with_the_numbers(engines):
    with pytest.raises(RequestError) as caught:
        engines().submit(PROMPTS[2], max_new_tokens=50, proposer="prompt_lookup", k=4)
    problem = caught.value.problems[0]
    assert problem.path == "max_new_tokens" and problem.value == 12 + 50 + 4 + 1
    assert "64" in problem.message and "at most 47" in problem.remedy


def test_generate_many_names_the_prompt_and_queues_nothing(engines):
    engine = engines()
    with pytest.raises(RequestError) as caught:
        engine.generate_many([PROMPTS[0], PROMPTS[1]], [
            speculant.GenerationOptions(max_new_tokens=4),
            speculant.GenerationOptions(max_new_tokens=4, logprobs=-1)])
    assert caught.value.problems[0].path == "prompts[1].logprobs"
    engine.scheduler.step()
    assert not engine.scheduler.has_work
    with pytest.raises(RequestError, match="3 options for 2 prompts"):
        engine.generate_many(PROMPTS[:2], [speculant.GenerationOptions()] * 3)


def test_a_package_without_a_batched_graph_says_so(roots):
    engine = speculant.load(roots["plain"])
    with pytest.raises(RequestError) as caught:
        engine.generate_many(PROMPTS[:2], max_new_tokens=4)
    problem = caught.value.problems[0]
    assert problem.path == "batch" and "batch=N" in problem.remedy


@pytest.mark.parametrize(("fields", "path"), [({"max_batch": 0}, "max_rows"),
                                               ({"max_batch": ROWS + 1}, "max_rows"),
                                               ({"prefill_chunk": 0}, "prefill_chunk")])
def test_a_bad_scheduler_shape_is_refused_by_field(roots, fields, path):
    engine = speculant.load(roots["pair"], **fields)
    with pytest.raises(AdmissionError) as caught:
        engine.submit(PROMPTS[0], max_new_tokens=4)
    assert caught.value.problems[0].path.endswith(path)


def test_a_missing_batched_graph_is_refused_at_load_by_field(roots, tmp_path):
    import shutil

    from speculant.errors import MetadataError

    copy = shutil.copytree(roots["pair"], tmp_path / "pair")
    (copy / "target" / "batched.onnx").unlink()
    with pytest.raises(MetadataError) as caught:
        speculant.load(copy)
    problem = caught.value.problems[0]
    assert problem.path.endswith("update.batch.artifacts.target")
    assert problem.value == "target/batched.onnx"


@pytest.mark.parametrize("prompts", ["0123", [7, 3, 41], 7])
def test_generate_many_wants_a_list_of_prompts(engines, prompts):
    with pytest.raises(RequestError) as caught:
        engines().generate_many(prompts, max_new_tokens=4)
    assert caught.value.problems[0].path == "prompts"
    assert engines().generate_many([], max_new_tokens=4) == []


def test_a_failed_pass_ends_its_step_s_requests_and_the_next_ones_decode(fresh_engine,
                                                                        monkeypatch):
    from speculant.errors import ContractError

    run = batched_pass.BatchedTargetPass.run
    calls = []

    def fails_once(self, blocks):
        calls.append(len(blocks))
        if len(calls) == 3:
            raise ContractError("planted: the pass failed", path="logits")
        return run(self, blocks)

    monkeypatch.setattr(batched_pass.BatchedTargetPass, "run", fails_once)
    with pytest.raises(ContractError) as caught:
        fresh_engine.generate_many(PROMPTS[:3], max_new_tokens=6)
    assert caught.value.problems[0].path == "prompts[0].logits"
    assert not fresh_engine.scheduler.has_work
    assert mismatches(fresh_engine, PROMPTS[:3], [{"max_new_tokens": 6}] * 3) == []


def test_a_proposer_error_ends_its_request_alone(fresh_engine, monkeypatch):
    from speculant.speculative.prompt_lookup import PromptLookupProposer

    propose = PromptLookupProposer.propose

    def refuses_one(self, state, k):
        if state.prompt_len == len(PROMPTS[1]) and state.num_generated >= 2:
            raise RequestError("planted: this request's proposer failed", path="proposer")
        return propose(self, state, k)

    monkeypatch.setattr(PromptLookupProposer, "propose", refuses_one)
    handles = [fresh_engine.submit(p, max_new_tokens=8, proposer="prompt_lookup", k=2)
               for p in PROMPTS[:3]]
    with pytest.raises(RequestError, match="planted"):
        list(handles[1])
    for i in (0, 2):
        assert list(handles[i]) == alone(fresh_engine, PROMPTS[i], max_new_tokens=8,
                                         proposer="prompt_lookup", k=2).token_ids
    assert handles[1].state.stop_reason == "error" and not fresh_engine.scheduler.has_work


def test_an_onnx_runtime_failure_of_the_pass_is_a_typed_error(fresh_engine, monkeypatch):
    from speculant.errors import ContractError
    from speculant.session.plan import PassPlan

    def broken(self):
        raise RuntimeError("planted: ORT failed")

    target = fresh_engine.scheduler.target
    monkeypatch.setattr(PassPlan, "run", broken)
    with pytest.raises(ContractError) as caught:
        fresh_engine.generate_many(PROMPTS[:2], max_new_tokens=4)
    problem = caught.value.problems[0]
    assert "planted: ORT failed" in problem.message and problem.file == target.artifact
    assert problem.path.endswith("update.batch.artifacts.target")


@pytest.mark.parametrize("defect", [None, "grown_without_copy"])
def test_buffers_grow_mid_decode_with_every_row_kept(roots, monkeypatch, defect):
    """The batched buffers start small and double when a request that needs more takes a row
    while others decode (here 8 slots, then 32); every request still equals its output
    alone. Planted: growing without copying the decoding rows' slots is caught."""
    import speculant.workflow.batched_pass as batched_pass

    monkeypatch.setattr(batched_pass, "CAPACITY_STEP", 8)
    if defect == "grown_without_copy":
        monkeypatch.setattr(batched_pass, "copy_prefix", lambda *args: None)
    engine = speculant.load(roots["pair"], max_batch=3)
    scheduler = engine.scheduler
    assert scheduler.target.capacity == 8
    requests = [([7, 3, 41], 3), ([9, 2], 4), ([33, 48, 2, 17, 5], 12)]  # reserve 8, 8, 19
    handles = [engine.submit(prompt, max_new_tokens=n, proposer="prompt_lookup", k=1)
               for prompt, n in requests[:2]]
    scheduler.step()
    scheduler.step()  # both rows hold their prompt and a token: then the long one joins
    assert scheduler.target.capacity == 8
    handles.append(engine.submit(requests[2][0], max_new_tokens=requests[2][1],
                                 proposer="prompt_lookup", k=1))
    while not all(handle.is_finished for handle in handles):
        scheduler.step()
    assert scheduler.target.capacity == 32
    differing = [i for i, ((prompt, n), handle) in enumerate(zip(requests, handles,
                                                                 strict=True))
                 if handle.result.token_ids != alone(engine, prompt, max_new_tokens=n,
                                                     proposer="prompt_lookup",
                                                     k=1).token_ids]
    assert (differing == []) == (defect is None), differing


LONG_PROMPTS = [[(7 * i + 3) % 50 for i in range(21)], [(11 * i + 5) % 50 for i in range(30)]]


@pytest.mark.parametrize("proposer, k", [(None, None), ("prompt_lookup", 2), ("chained", 2)])
def test_a_long_prompt_joining_runs_alone_on_its_row_and_every_request_equals_alone(
        roots, monkeypatch, proposer, k):
    """A prompt chunk wider than KEPT_WIDTHS runs on its own row through the batch-1 graph
    while the decoding rows run together (not padded to the chunk); each request equals its
    output alone and every pass writes only its rows' valid slots."""
    engine = speculant.load(roots["pair"], max_batch=ROWS, prefill_chunk=32)
    found = checked_writes(engine, monkeypatch)
    options = {"proposer": proposer, "k": k} if proposer else {}
    handles = [engine.submit(prompt, max_new_tokens=n, **options)
               for prompt, n in zip(PROMPTS[:2], MAX_NEW[:2], strict=True)]
    for _ in range(3):
        engine.scheduler.step()  # both decode; then the long prompts join apart
    widths = []
    run = batched_pass.BatchedTargetPass._pass

    def recorded(self, blocks, first, rows):
        widths.append((first, rows, max(len(b.tokens) for b in blocks)))
        return run(self, blocks, first, rows)

    monkeypatch.setattr(batched_pass.BatchedTargetPass, "_pass", recorded)
    handles += [engine.submit(prompt, max_new_tokens=12, **options) for prompt in LONG_PROMPTS]
    while not all(handle.is_finished for handle in handles):
        engine.scheduler.step()
    assert found == []
    assert any(rows == 1 and width > batched_pass.KEPT_WIDTHS for _, rows, width in widths)
    assert all(width <= batched_pass.KEPT_WIDTHS for _, rows, width in widths if rows > 1)
    requests = [*zip(PROMPTS[:2], MAX_NEW[:2], strict=True), *[(p, 12) for p in LONG_PROMPTS]]
    for (prompt, n), handle in zip(requests, handles, strict=True):
        assert handle.result.token_ids == alone(engine, prompt, max_new_tokens=n,
                                                **options).token_ids
