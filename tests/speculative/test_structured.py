"""Constrained decoding with speculation: under a JSON schema, every proposer commits the
target's constrained plain output, token for token, and the text validates against the
schema (workflow/constraint.py; docs/design/structured.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import speculant
from speculant import GenerationOptions, Grammar, RequestError
from speculant.tensors import Value, make_seam

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the outputs")

DEMO = Path(speculant.__file__).parent / "demo"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 99},
                   "kind": {"enum": ["cat", "dog"]},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                            "maxItems": 3},
                   "ok": {"type": "boolean"}},
    "required": ["name", "age", "kind", "tags", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["def get_user():\n    return ", "user = "]


@pytest.fixture(scope="module")
def demo() -> speculant.Engine:
    return speculant.load(DEMO, draft=DEMO.parent / "demo_draft")


@pytest.fixture(scope="module")
def demo_static(tmp_path_factory) -> speculant.Engine:
    """The demo pair with static caches: greedy chained drafts stay where they were made,
    except under a grammar (chosen on the host)."""
    from speculant_tools.export import convert

    return speculant.load(convert(DEMO, tmp_path_factory.mktemp("demo") / "static", "float32",
                                  cache="static"))


def constrained(engine, prompt, **options):
    return engine.generate(prompt, GenerationOptions(max_new_tokens=80,
                                                     grammar=Grammar.json_schema(SCHEMA),
                                                     **options))


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("proposer, k", [("prompt_lookup", 4), ("chained", 4),
                                         ("chained", "auto"), ("draft", 3)])
def test_speculative_constrained_output_is_plain_constrained_output(demo, prompt, proposer,
                                                                    k):
    plain = constrained(demo, prompt)
    speculative = constrained(demo, prompt, proposer=proposer, k=k)
    assert speculative.token_ids == plain.token_ids
    assert plain.finish_reason == "stop" and plain.stats.stop_reason == "grammar"
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    if k == 4 and proposer == "chained":  # drafts were verified (auto may pick width 0)
        assert speculative.stats.mean_accepted_length > 1


def test_static_caches_under_a_grammar_give_plain_constrained_output(demo_static):
    plain = constrained(demo_static, PROMPTS[0])
    speculative = constrained(demo_static, PROMPTS[0], proposer="chained", k=4)
    assert speculative.token_ids == plain.token_ids
    jsonschema.validate(json.loads(plain.text), SCHEMA)


def test_sampled_constrained_output_is_the_same_with_speculation(demo):
    options = dict(temperature=0.9, seed=11)
    plain = constrained(demo, PROMPTS[1], **options)
    speculative = constrained(demo, PROMPTS[1], proposer="chained", k=4, **options)
    assert speculative.token_ids == plain.token_ids
    jsonschema.validate(json.loads(plain.text), SCHEMA)


def test_json_object_mode_gives_an_object(demo):
    result = demo.generate("x = ", GenerationOptions(max_new_tokens=60, proposer="chained",
                                                     grammar=Grammar.json_schema()))
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:  # cut by max_new_tokens: a prefix of an object
        assert result.text.startswith("{")


def test_without_a_grammar_the_text_is_not_json(demo):
    """The grammar is what makes the output JSON (the test above would pass vacuously if the
    model wrote it anyway)."""
    text = demo.generate(PROMPTS[0], GenerationOptions(max_new_tokens=30)).text
    with pytest.raises(ValueError):
        json.loads(text)


def test_a_draft_the_grammar_refuses_ends_the_masked_rows(demo):
    from speculant.workflow.constraint import compile_constraint

    tokenizer = demo.tokenizer
    constraint = compile_constraint(Grammar.json_schema(SCHEMA), demo.package.tokenizer_file,
                                    [0], demo.vocab_size)
    brace, = tokenizer.encode("{", add_special_tokens=False)
    quote = tokenizer.encode('"', add_special_tokens=False)[0]
    letter = tokenizer.encode("x", add_special_tokens=False)[0]
    seam = make_seam("cpu")
    scores = Value.host(
        np.random.default_rng(0).standard_normal((1, 4, demo.vocab_size)).astype(np.float32))
    masked = constraint.mask_rows(seam, scores, [brace, letter, quote]).data
    assert np.isfinite(masked[0, 0, brace]) and not np.isfinite(masked[0, 0, letter])
    assert np.isfinite(masked[0, 1, quote]) and not np.isfinite(masked[0, 1, letter])
    assert np.array_equal(masked[0, 2:], scores.data[0, 2:])  # after the refused draft
    again = constraint.mask_rows(seam, scores, [])  # the matcher moved back
    assert np.array_equal(again.data[0, 0], masked[0, 0])


def test_a_schema_that_does_not_compile_is_a_request_error(demo):
    with pytest.raises(RequestError) as refused:
        demo.generate("x", GenerationOptions(max_new_tokens=4,
                                             grammar=Grammar.json_schema({"type": "objekt"})))
    assert refused.value.problems[0].path == "grammar" and "objekt" in str(refused.value)
    with pytest.raises(RequestError, match="grammar must be a Grammar"):
        demo.generate("x", GenerationOptions(max_new_tokens=4, grammar={"type": "object"}))


def test_without_llguidance_a_grammar_names_the_extra(demo, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(RequestError) as refused:
        demo.generate("x", GenerationOptions(max_new_tokens=4, grammar=Grammar.json_schema()))
    assert "speculant[structured]" in str(refused.value)


def spy_on_proposals(monkeypatch, proposer_class) -> list[tuple[list[int], list[int], int]]:
    """Each proposal under a grammar as (the grammar's forced tokens before it, its drafts,
    how many of them the grammar allows in turn), recorded as it is made."""
    made = []
    propose = proposer_class.propose

    def recorded(self, state, k):
        forced = state.constraint.forced_tokens(k)
        proposal = propose(self, state, k)
        assert proposal.drafts is None  # drafts under a grammar are read on the host
        made.append((forced, proposal.tokens, state.constraint.num_valid(proposal.tokens)))
        return proposal

    monkeypatch.setattr(proposer_class, "propose", recorded)
    return made


@pytest.mark.parametrize("engine, proposer", [("demo", "prompt_lookup"), ("demo", "chained"),
                                              ("demo_static", "chained"), ("demo", "draft")])
def test_drafts_under_a_grammar_are_grammar_valid_and_start_with_its_forced_run(
        request, monkeypatch, engine, proposer):
    from speculant.speculative.chained import ChainedProposer
    from speculant.speculative.draft_model import DraftModelProposer
    from speculant.speculative.prompt_lookup import PromptLookupProposer

    engine = request.getfixturevalue(engine)
    made = spy_on_proposals(monkeypatch, {"chained": ChainedProposer, "draft": DraftModelProposer,
                                          "prompt_lookup": PromptLookupProposer}[proposer])
    plain = constrained(engine, PROMPTS[0])
    speculative = constrained(engine, PROMPTS[0], proposer=proposer,
                              k=3 if proposer == "draft" else 4)
    assert speculative.token_ids == plain.token_ids
    assert made and all(num_valid == len(drafts) for _, drafts, num_valid in made)
    assert all(drafts[:len(forced)] == forced for forced, drafts, _ in made)
    assert any(len(forced) >= 2 for forced, _, _ in made)  # a forced run, drafted in full


def test_a_forced_draft_is_the_only_id_its_row_allows(demo):
    """The invariant that makes a forced draft certain: where the grammar allows one id, the
    target's masked row has every other id at -inf."""
    from speculant.workflow.constraint import compile_constraint

    constraint = compile_constraint(Grammar.json_schema(SCHEMA), demo.package.tokenizer_file,
                                    [0], demo.vocab_size)
    constraint.commit(demo.tokenizer.encode("{", add_special_tokens=False)[0])
    forced = constraint.forced_tokens(8)
    assert len(forced) >= 2
    scores = Value.host(np.random.default_rng(1).standard_normal(
        (1, len(forced) + 1, demo.vocab_size)).astype(np.float32))
    masked = constraint.mask_rows(make_seam("cpu"), scores, forced).data[0]
    for row, token in zip(masked, forced, strict=False):
        if np.isfinite(row).sum() == 1:
            assert int(np.argmax(row)) == token
    assert np.isfinite(masked[0]).sum() == 1  # the first is forced outright


@pytest.fixture(scope="module")
def demo_batched(tmp_path_factory) -> speculant.Engine:
    """The demo pair with static caches and a batched pass of 4 rows (the scheduler's)."""
    from speculant_tools.export import convert

    root = convert(DEMO, tmp_path_factory.mktemp("demo") / "batched", "float32",
                   cache="static", batch=4)
    return speculant.load(root, max_batch=4, prefill_chunk=5)


@pytest.mark.parametrize("sampled", [False, True])
def test_chained_rows_under_a_grammar_draft_and_decode_as_alone(demo_batched, monkeypatch,
                                                                sampled):
    """Requests decoded together, the chained drafter drafting every row in one run per
    draft: a row under a grammar drafts what it drafts alone at the same C (its forced run
    first, then its row masked by its grammar, cut where the grammar refuses or ends) beside
    rows without one, and every output equals its output alone."""
    from speculant.speculative.chain_rows import ChainRows
    from speculant.speculative.chained import ChainedProposer

    engine = demo_batched
    sampling = {"temperature": 0.9, "seed": 3} if sampled else {}
    options = [GenerationOptions(max_new_tokens=n, proposer="chained", k=k, **sampling,
                                 grammar=Grammar.json_schema(SCHEMA) if i % 2 == 0 else None)
               for i, (n, k) in enumerate([(60, 4), (24, 2), (40, 3), (30, 4)])]
    prompts = [*PROMPTS, "x = ", "def f():\n    return "]
    made: dict[tuple, dict[str, list[int]]] = {}

    def spy(method, how):
        def recorded(self, *args):
            results = method(self, *args)
            pairs = args[0] if how == "together" else [args]
            for (state, _), result in zip(pairs, results if how == "together" else [results],
                                          strict=True):
                where = (tuple(state.tokens[:state.prompt_len]), state.consumed)
                made.setdefault(where, {})[how] = list(result.tokens) if result.drafts is None \
                    else np.asarray(result.drafts.data).tolist()  # kept where made
            return results
        return recorded

    monkeypatch.setattr(ChainRows, "propose_rows", spy(ChainRows.propose_rows, "together"))
    monkeypatch.setattr(ChainedProposer, "propose", spy(ChainedProposer.propose, "alone"))
    together = engine.generate_many(prompts, options)
    alone = [engine.generate(prompt, option) for prompt, option in zip(prompts, options,
                                                                       strict=True)]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    compared = [(m["together"], m["alone"]) for m in made.values() if len(m) == 2]
    assert len(compared) >= 20 and all(a == b for a, b in compared)
    assert sum(g.stats.mean_accepted_length > 1 for g in together[::2]) >= 1  # drafts kept
    jsonschema.validate(json.loads(together[0].text), SCHEMA)
