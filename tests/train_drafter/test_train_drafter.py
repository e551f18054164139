"""``speculant train-drafter`` end to end on a tiny random Llama package (CPU, seconds): the
written pair runs in speculant with speculative == greedy, the report carries its figures and
repeats the runtime's own acceptance, a resumed run continues the checkpoint, and the Magpie
split keeps every request on one side."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="train-drafter needs PyTorch (the train extra)")

from tiny_target import CHAT_TEMPLATE, EOS_ID, write_tiny_package  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import speculant  # noqa: E402
from speculant.cli import full_app  # noqa: E402
from speculant.text.chat import ChatTemplate  # noqa: E402
from speculant.text.tokenizer import Tokenizer  # noqa: E402
from speculant_tools.export import LlamaConfig, drafter_shapes, read_weights  # noqa: E402
from speculant_tools.importers import read_drafter  # noqa: E402
from speculant_tools.train_drafter.corpus import Corpus, load_corpus, save_corpus  # noqa: E402
from speculant_tools.train_drafter.magpie import ChatPrompts, normalized  # noqa: E402

DRAFT_VOCAB = 40  # of the tiny target's 74 ids: the subset vocabulary
SMOKE = ["--device", "cpu", "--minutes", "4", "--num-requests", "48", "--request-tokens", "12",
         "--keep-unfinished-requests", "--held-out-fraction", "0.25", "--answer-tokens", "16",
         "--sampled-passes", "1", "--generation-batch", "16", "--num-eval", "4",
         "--eval-tokens", "12", "--draft-vocab-size", str(DRAFT_VOCAB), "--batch-size", "4",
         "--max-steps", "2", "--validate-every", "2", "--reserve-seconds", "0"]
runner = CliRunner()
app = full_app()


def train_drafter_cli(*args) -> None:
    result = runner.invoke(app, ["train-drafter", *map(str, args)])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    return write_tiny_package(tmp_path_factory.mktemp("tiny") / "package")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_package):
    """OUT after one smoke run: (out, the report)."""
    out = tmp_path_factory.mktemp("train") / "out"
    train_drafter_cli(tiny_package, out, *SMOKE)
    return out, json.loads((out / "drafter_report.json").read_text())


@pytest.fixture(scope="module")
def trained_eagle3(tmp_path_factory, tiny_package):
    """OUT after one smoke run with EAGLE-3's fused seed: (out, the report)."""
    out = tmp_path_factory.mktemp("train") / "eagle3"
    train_drafter_cli(tiny_package, out, *SMOKE, "--features", "eagle3")
    return out, json.loads((out / "drafter_report.json").read_text())


def test_the_report_has_its_figures(trained):
    out, report = trained
    assert np.isfinite(report["validation_loss"]) and report["validation_loss"] >= 0
    assert 1.0 <= report["mean_accepted_length_k4"] <= 5.0
    assert 0.0 <= report["first_draft_acceptance_k4"] <= 1.0
    for k in ("1", "2", "4", "8"):
        assert report["acceptance"][k]["rounds"] > 0
        assert len(report["acceptance"][k]["acceptance_by_position"]) == int(k)
    assert report["training"]["steps"] == 2 and report["draft_vocab_size"] == DRAFT_VOCAB
    assert report["features"] == "last" and report["seed_feature_layers"] is None
    assert report["corpus"]["held_out_requests"] > 0 and report["corpus"]["train_examples"] > 0
    assert (out / "loss_curves.png").stat().st_size > 0


def test_the_drafter_files_are_what_the_builtin_reads(trained):
    out, _ = trained
    settings = json.loads((out / "drafter_config.json").read_text())
    assert settings["draft_vocab_size"] == DRAFT_VOCAB and settings["max_proposal_width"] == 8
    target_config = LlamaConfig.from_hf(settings["target"]["config"])  # as the builtin's test
    shipped = read_drafter(out, target_config)  # as the built-in import reads them
    assert shipped.vocab_size == DRAFT_VOCAB and shipped.scale == target_config.hidden_size ** 0.5
    config, _, drafter = read_weights(out / "package")
    assert config.draft_vocab_size == DRAFT_VOCAB
    with np.load(out / "drafter.npz") as archive:
        assert list(archive.files) == list(drafter_shapes(config))
        for name in archive.files:
            assert archive[name].dtype == np.float16
            np.testing.assert_array_equal(archive[name].astype(np.float32), drafter[name])


@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_the_package_speculates_exactly_greedy(trained, k):
    out, _ = trained
    engine = speculant.load(out / "package")
    num_drafts = 0
    for prompt in ([1, 10, 20, 30, 4, 5], [1, 40, 41]):
        plain = engine.generate(prompt, 24, stop_on_eos=False).token_ids
        run = engine.generate(prompt, 24, stop_on_eos=False, speculative=True, k=k)
        assert run.token_ids == plain
        num_drafts += run.stats.drafts_proposed
    assert num_drafts > 0


@pytest.mark.parametrize("run", ["trained", "trained_eagle3"])
def test_the_report_repeats_the_runtimes_acceptance(request, run):
    """The trainer's k = 4 figure, replayed from its greedy streams, equals what the runtime
    measures generating the same held-out prompts with the written pair (with the fused
    seed too: the target graph's seed is the trainer's)."""
    out, report = request.getfixturevalue(run)
    fingerprint = json.loads((out / "corpus" / "state.json").read_text())["fingerprint"]
    streams = load_corpus(out / "corpus", fingerprint).held_out[:4]
    engine = speculant.load(out / "package")
    rounds = accepted = 0
    for stream in streams:
        prompt = stream["ids"][:stream["prompt_len"]]
        run = engine.generate(prompt, 12, speculative=True, k=4)
        assert run.token_ids == stream["ids"][stream["prompt_len"]:]
        rounds += run.stats.rounds
        accepted += run.stats.rounds * run.stats.mean_accepted_length
    assert rounds == report["acceptance"]["4"]["rounds"]
    assert accepted / rounds == pytest.approx(report["mean_accepted_length_k4"])


def test_resume_continues_the_checkpoint_and_reuses_the_corpus(tmp_path, tiny_package):
    out = tmp_path / "out"
    train_drafter_cli(tiny_package, out, *SMOKE)
    corpus_state = (out / "corpus" / "state.json").read_text()
    before = (out / "train_log.jsonl").read_text().splitlines()
    result = runner.invoke(app, ["train-drafter", str(tiny_package), str(out), *SMOKE])
    assert result.exit_code != 0 and "--resume" in result.output
    train_drafter_cli(tiny_package, out, *SMOKE, "--resume")
    report = json.loads((out / "drafter_report.json").read_text())
    assert report["training"]["steps"] == 4 and report["training"]["calls"] == 2
    assert report["training"]["steps_this_call"] == 2
    assert (out / "corpus" / "state.json").read_text() == corpus_state
    assert len((out / "train_log.jsonl").read_text().splitlines()) > len(before)


def test_the_split_keeps_each_request_on_one_side(trained):
    out, _ = trained
    lines = (out / "corpus" / "requests.jsonl").read_text().splitlines()
    requests = [json.loads(line) for line in lines]
    held = {normalized(r["text"]) for r in requests if r["held_out"]}
    trained_keys = {normalized(r["text"]) for r in requests if not r["held_out"]}
    assert held and trained_keys and not held & trained_keys
    assert len(held) + len(trained_keys) == len(requests)  # deduplicated
    chat = ChatPrompts(ChatTemplate(CHAT_TEMPLATE, "", "", "test"),
                       Tokenizer.from_file(out / "target" / "tokenizer.json"))
    held_prompts = {tuple(chat.answer_prompt(r["text"])) for r in requests if r["held_out"]}
    fingerprint = json.loads((out / "corpus" / "state.json").read_text())["fingerprint"]
    corpus = load_corpus(out / "corpus", fingerprint)
    assert {tuple(e["ids"][:e["prompt_len"]]) for e in corpus.held_out} <= held_prompts
    assert not {tuple(e["ids"][:e["prompt_len"]]) for e in corpus.train} & held_prompts
    assert all(e["ids"][-1] == EOS_ID or len(e["ids"]) - e["prompt_len"] == 12
               for e in corpus.held_out)


@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_the_eagle3_package_speculates_exactly_greedy(trained_eagle3, k):
    out, _ = trained_eagle3
    engine = speculant.load(out / "package")
    num_drafts = 0
    for prompt in ([1, 10, 20, 30, 4, 5], [1, 40, 41]):
        plain = engine.generate(prompt, 24, stop_on_eos=False).token_ids
        run = engine.generate(prompt, 24, stop_on_eos=False, speculative=True, k=k)
        assert run.token_ids == plain
        num_drafts += run.stats.drafts_proposed
    assert num_drafts > 0


def test_the_eagle3_run_says_what_seeded_it(trained_eagle3):
    out, report = trained_eagle3
    assert report["features"] == "eagle3" and report["seed_feature_layers"] == [1, 1, 2]
    settings = json.loads((out / "drafter_config.json").read_text())
    assert settings["seed_feature_layers"] == [1, 1, 2]
    shipped = read_drafter(out, LlamaConfig.from_hf(settings["target"]["config"]))
    assert shipped.seed_feature_layers == (1, 1, 2)
    assert any(name.startswith("drafter.seed_fusion.") for name in shipped.weights)
    config, _, drafter = read_weights(out / "package")  # the projection is in the target's graph
    assert config.seed_feature_layers == (1, 1, 2)
    for name, array in shipped.weights.items():
        np.testing.assert_array_equal(array.astype(np.float32), drafter[name])


def test_resume_refuses_another_seed(tmp_path, tiny_package, trained_eagle3):
    out = tmp_path / "out"
    shutil.copytree(trained_eagle3[0], out)
    result = runner.invoke(app, ["train-drafter", str(tiny_package), str(out), *SMOKE,
                                 "--resume"])
    assert result.exit_code != 0 and "--features" in result.output


def test_a_resumed_call_answers_what_the_first_calls_budget_left(tmp_path, tiny_package):
    """A corpus whose data budget ended early (half of its greedy answers and all of its
    sampled ones taken away, as a short budget leaves it) is completed by the next resumed
    call: the greedy answers come back token for token, the sampled pass is made again, and
    the requests and held-out streams stay as they were; --no-grow-corpus leaves it."""
    out = tmp_path / "out"
    train_drafter_cli(tiny_package, out, *SMOKE)
    folder = out / "corpus"
    fingerprint = json.loads((folder / "state.json").read_text())["fingerprint"]
    full = load_corpus(folder, fingerprint)
    greedy = [e for e in full.train if not e["is_sampled"]]
    assert len(greedy) >= 4 and any(e["is_sampled"] for e in full.train)
    short = Corpus(full.requests, greedy[::2], full.held_out,
                   {**full.stats, "train_examples": len(greedy[::2])})
    save_corpus(folder, short, fingerprint)
    train_drafter_cli(tiny_package, out, *SMOKE, "--resume", "--no-grow-corpus")
    assert len(load_corpus(folder, fingerprint).train) == len(greedy[::2])
    train_drafter_cli(tiny_package, out, *SMOKE, "--resume")
    grown = load_corpus(folder, fingerprint)

    def answers(examples, sampled):
        return sorted(tuple(e["ids"]) for e in examples if e["is_sampled"] == sampled)

    assert answers(grown.train, False) == answers(full.train, False)
    assert len(answers(grown.train, True)) == len(answers(full.train, True))
    assert grown.held_out == full.held_out and grown.requests == full.requests
    report = json.loads((out / "drafter_report.json").read_text())
    assert report["corpus"]["train_examples"] == len(grown.train)
