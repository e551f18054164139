"""`speculant generate` with each proposer and with sampling: --proposer
chained|draft|prompt_lookup, --draft PATH, --k, --temperature, --top-k, --top-p, --seed — the
same tokens as the API, the proposer's figures under --stats, and bad input as one clean error
(exit status 2)."""

from __future__ import annotations

import pytest
from test_cli_generate import assert_clean_failure, counters, flat

import speculant
from builders.writers import write_decoder_package

PROMPT = "def "


@pytest.fixture(scope="session")
def draft_path(tmp_path_factory):
    """A draft model for the decoder fixture: the same function, other deviation positions."""
    return write_decoder_package(tmp_path_factory.mktemp("cli") / "draft",
                                 deviation_positions={3, 4, 9, 13, 19, 25, 36})


@pytest.fixture(scope="session")
def with_draft(decoder_path, draft_path):
    return speculant.load(decoder_path, draft=draft_path)


def run(cli, *args):
    result = cli("generate", *args, "--prompt", PROMPT, "--stats")
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("k", [1, 3])
def test_lookup(cli, decoder_path, engines, k):
    expected = engines(decoder_path).generate(PROMPT, 40, proposer="prompt_lookup", k=k)
    result = run(cli, decoder_path, "--max-new-tokens", 40, "--proposer", "prompt_lookup", "--k", k)
    assert result.stdout == expected.text + "\n"
    assert expected.token_ids == engines(decoder_path).generate(PROMPT, 40).token_ids
    rows = counters(result.stderr)
    assert rows["proposer"] == "prompt_lookup" and rows["proposer_invocations"] == "0"
    for name in ("rounds", "greedy_steps", "drafts_proposed", "accepted_drafts"):
        assert rows[name] == str(getattr(expected.stats, name)), name


def test_draft_implied_by_the_draft_path(cli, decoder_path, draft_path, with_draft):
    """--draft alone selects the draft model; --k 4 is the smaller rollback bound (the
    target's rollback_positions 4; the draft allows 4 + 1)."""
    expected = with_draft.generate(PROMPT, 40, proposer="draft", k=4)
    result = run(cli, decoder_path, "--max-new-tokens", 40, "--draft", draft_path, "--k", 4)
    assert result.stdout == expected.text + "\n"
    rows = counters(result.stderr)
    assert rows["proposer"] == "draft"
    assert rows["proposer_invocations"] == rows["drafts_proposed"] == \
        str(expected.stats.drafts_proposed)
    assert int(rows["rounds"]) > 0 and int(rows["rollbacks"]) > 0
    assert "acceptance by position: 1:" in flat(result.stderr)


def test_proposer_chained_is_speculative(cli, chained_path):
    one = run(cli, chained_path, "--max-new-tokens", 30, "--speculative", "--k", 2)
    two = run(cli, chained_path, "--max-new-tokens", 30, "--proposer", "chained", "--k", 2)
    assert one.stdout == two.stdout
    assert counters(one.stderr) == counters(two.stderr)


@pytest.mark.parametrize("proposer", [[], ["--proposer", "prompt_lookup", "--k", "2"],
                                      ["--proposer", "chained", "--k", "2"]],
                         ids=["plain", "prompt_lookup", "chained"])
def test_sampling_equals_the_api(cli, chained_path, engines, proposer):
    options = {"temperature": 3.0, "top_k": 20, "top_p": 0.9, "seed": 5}
    api = {"plain": {}, "prompt_lookup": {"proposer": "prompt_lookup", "k": 2},
           "chained": {"proposer": "chained", "k": 2}}[proposer[1] if proposer else "plain"]
    expected = engines(chained_path).generate(PROMPT, 30, **options, **api)
    result = run(cli, chained_path, "--max-new-tokens", 30, *proposer, "--temperature", 3,
                 "--top-k", 20, "--top-p", 0.9, "--seed", 5)
    assert result.stdout == expected.text + "\n"
    rows = counters(result.stderr)
    assert int(rows["sampled_rows"]) > 0 and rows["argmax_rows"] == "0"
    greedy = engines(chained_path).generate(PROMPT, 30).text
    assert expected.text != greedy  # temperature 3 does move the fixture off its argmax


def test_seed_changes_the_sample(cli, decoder_path):
    one = run(cli, decoder_path, "--max-new-tokens", 30, "--temperature", 3, "--seed", 1)
    two = run(cli, decoder_path, "--max-new-tokens", 30, "--temperature", 3, "--seed", 2)
    again = run(cli, decoder_path, "--max-new-tokens", 30, "--temperature", 3, "--seed", 1)
    assert one.stdout == again.stdout != two.stdout


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["--proposer", "draft", "--k", "2"], ["RequestError", "draft", "--draft"]),
    (["--proposer", "medusa", "--k", "2"], ["RequestError", "proposer", "medusa"]),
    (["--proposer", "prompt_lookup", "--k", "5"], ["RequestError", "rollback_positions", "5"]),
    (["--proposer", "prompt_lookup", "--k", "0"], ["RequestError", "k"]),
    (["--proposer", "chained", "--k", "2"], ["RequestError", "speculative"]),
    (["--temperature", "-1"], ["RequestError", "temperature"]),
    (["--temperature", "1", "--top-p", "0"], ["RequestError", "top_p"]),
    (["--temperature", "1", "--top-p", "1.5"], ["RequestError", "top_p"]),
    (["--temperature", "1", "--top-k", "-1"], ["RequestError", "top_k"]),
    (["--temperature", "1", "--seed", "-1"], ["RequestError", "seed"]),
])
def test_bad_input(cli, decoder_path, args, words):
    result = cli("generate", decoder_path, "--prompt", PROMPT, *args)
    assert_clean_failure(result, *words)
    assert result.stdout == ""


def test_missing_draft_package(cli, decoder_path, tmp_path):
    result = cli("generate", decoder_path, "--draft", tmp_path / "no-draft")
    assert_clean_failure(result, "MetadataError", "no-draft")
