"""The pieces of train-drafter on the tiny target: the PyTorch Llama equals speculant's own
graph, batched generation equals a full recompute, the vectorised chain equals one round
written plainly, the round replay keeps its accounting, the Magpie requests are deduplicated
and split by request, and bad input is a TrainDrafterError naming it."""

from __future__ import annotations

import random
import shutil

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch", reason="train-drafter needs PyTorch (the train extra)")

from tiny_target import CHAT_TEMPLATE, CONFIG, checkpoint, write_tiny_package  # noqa: E402

from speculant.text.chat import ChatTemplate  # noqa: E402
from speculant.text.tokenizer import Tokenizer  # noqa: E402
from speculant_tools.export import export_hf  # noqa: E402
from speculant_tools.export.graphs import CONFIG_KEY  # noqa: E402
from speculant_tools.importers import write_checkpoint  # noqa: E402
from speculant_tools.train_drafter import TrainDrafterError, TrainOptions  # noqa: E402
from speculant_tools.train_drafter.acceptance import chain_drafts, replay_rounds  # noqa: E402
from speculant_tools.train_drafter.drafter import ChainedDrafter  # noqa: E402
from speculant_tools.train_drafter.generate import (  # noqa: E402
    Sampling,
    generate_batch,
)
from speculant_tools.train_drafter.llama import TorchLlama, rope_tables  # noqa: E402
from speculant_tools.train_drafter.magpie import (  # noqa: E402
    ChatPrompts,
    Request,
    clean_requests,
    split_by_request,
)
from speculant_tools.train_drafter.objective import Batch, Objective, chained_loss  # noqa: E402
from speculant_tools.train_drafter.pipeline import train_drafter  # noqa: E402
from speculant_tools.train_drafter.source import read_source  # noqa: E402

IDS = [[1, 10, 33, 40, 5, 61, 7, 20, 21, 22, 13]]


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    return write_tiny_package(tmp_path_factory.mktemp("tiny") / "package")


@pytest.fixture(scope="module")
def target(tiny_package):
    source = read_source(tiny_package)
    return TorchLlama(source.config, source.weights)


def test_the_torch_llama_equals_speculants_graph(tmp_path, target):
    """Hidden state, last-layer keys and values, logits: the appended-cache ONNX graph the
    runtime runs (onnxruntime) against the PyTorch forward, from an empty cache."""
    ort = pytest.importorskip("onnxruntime")
    root = write_checkpoint(checkpoint(), tmp_path / "appended", cache="appended")
    session = ort.InferenceSession(str(root / "decoder" / "model.onnx"))
    ids = np.array(IDS, np.int64)
    empty = np.zeros((1, CONFIG.num_key_value_heads, 0, CONFIG.head_dim), np.float32)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None]}
    for i in range(CONFIG.num_hidden_layers):
        feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = empty
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    with torch.no_grad():
        state = target.features(torch.tensor(IDS))
        logits = target.logits(state.hidden)
    last = CONFIG.num_hidden_layers - 1
    pairs = [(state.hidden, outputs["hidden_states"]), (logits, outputs["logits"]),
             (state.keys, outputs[f"present.{last}.key"]),
             (state.values, outputs[f"present.{last}.value"])]
    for mine, theirs in pairs:
        assert mine.shape == theirs.shape
        assert float((mine - torch.from_numpy(theirs)).abs().max()) < 1e-4


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_p=0.9)])
def test_batched_generation_equals_a_full_recompute(target, sampling):
    """Left-padded rows with a KV cache: each row's greedy tokens are the argmax of a full
    pass over its own prompt and tokens so far (sampled rows: each token is one the full
    pass gives positive probability within the nucleus, and rows stop at a stop id)."""
    prompts = [[1, 10, 20, 30, 4], [1, 40], [1, 50, 51, 52, 53, 54, 55]]
    stop_ids = {2}
    rows = generate_batch(target, prompts, max_new_tokens=10, stop_ids=stop_ids,
                          sampling=sampling, generator=torch.Generator().manual_seed(0))
    for prompt, row in zip(prompts, rows, strict=True):
        assert 1 <= len(row) <= 10 and all(t not in stop_ids for t in row[:-1])
        for i, token in enumerate(row):
            with torch.no_grad():
                state = target.features(torch.tensor([prompt + row[:i]]))
                scores = target.logits(state.hidden[0, -1])
            if sampling.is_greedy:
                assert token == int(scores.argmax())
            else:
                ranked = scores.argsort(descending=True).tolist()
                probs = torch.softmax(scores[ranked] / sampling.temperature, -1)
                before = (probs.cumsum(-1) - probs)[ranked.index(token)]
                assert float(before) < sampling.top_p


def test_the_vectorised_chain_equals_one_round_written_plainly(target):
    """``chain_drafts`` row c: the proposal of a round from context c, every step fed the
    cache cut to c + 1 alone (no causal mask), as the runtime feeds the borrowed cache."""
    drafter = ChainedDrafter(CONFIG, 40)
    torch.manual_seed(3)
    for parameter in drafter.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    ids = torch.tensor(IDS)
    k, rows = 3, 30
    drafts = chain_drafts(target, drafter, ids, k, rows)
    state = target.features(ids)
    for c in range(ids.shape[1] - 1):
        cos, sin = rope_tables(torch.tensor([c]), CONFIG.head_dim, CONFIG.rope_theta)
        keys, values = state.keys[:, :, :c + 1], state.values[:, :, :c + 1]
        carry, token, plain = state.hidden[:, c:c + 1], ids[:, c:c + 1], []
        for j in range(k + 1):
            carry = _one_step(drafter, target, token, carry, cos, sin, keys, values)
            token = ids[:, c + 1:c + 2] if j == 0 else target.logits(carry, rows).argmax(-1)
            if j:
                plain.append(int(token))
        assert drafts[0, c].tolist() == plain


def test_the_chained_loss_equals_its_definition_written_plainly(target):
    """Every step's KL and the teacher-forced KL of ``chained_loss``, recomputed context by
    context with the plain one-query step: rows are the answer-side contexts c whose c + j
    still has a next token; the teacher is the target's softmax over the first N ids at
    c + j; the mean is over all rows of the batch."""
    drafter = ChainedDrafter(CONFIG, 40)
    torch.manual_seed(4)
    for parameter in drafter.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    examples = [{"ids": IDS[0], "prompt_len": 4}, {"ids": IDS[0][:8], "prompt_len": 3}]
    objective = Objective(head_rows=30, unroll=3, teacher_forcing_weight=0.5)
    with torch.no_grad():
        parts = chained_loss(target, drafter, Batch.of(examples, torch.device("cpu")),
                             objective)
    step_kl = [[] for _ in range(objective.unroll)]
    forced_kl = []
    for example in examples:
        ids, prompt_len = torch.tensor([example["ids"]]), example["prompt_len"]
        with torch.no_grad():
            state = target.features(ids)
        teacher = torch.log_softmax(target.logits(state.hidden[0], 30), -1)  # [T, N]

        def kl(carry, at, teacher=teacher):
            log_q = torch.log_softmax(target.logits(carry[0, 0], 30), -1)
            return float((teacher[at].exp() * (teacher[at] - log_q)).sum())

        for c in range(prompt_len - 1, ids.shape[1] - 1):
            cos, sin = rope_tables(torch.tensor([c]), CONFIG.head_dim, CONFIG.rope_theta)
            keys, values = state.keys[:, :, :c + 1], state.values[:, :, :c + 1]
            carry = state.hidden[:, c:c + 1]
            for j in range(objective.unroll):
                if c + j > ids.shape[1] - 2:
                    break
                carry = _one_step(drafter, target, ids[:, c + j:c + j + 1], carry, cos, sin,
                                  keys, values)
                step_kl[j].append(kl(carry, c + j))
            if c + 1 <= ids.shape[1] - 2:
                forced = _one_step(drafter, target, ids[:, c + 1:c + 2],
                                   state.hidden[:, c:c + 1], cos, sin, keys, values)
                forced_kl.append(kl(forced, c + 1))
    assert parts.step_kl == pytest.approx([sum(k) / len(k) for k in step_kl], rel=1e-4)
    assert parts.teacher_forced_kl == pytest.approx(sum(forced_kl) / len(forced_kl), rel=1e-4)


def _one_step(drafter, target, token, carry, cos, sin, keys, values):
    """One step whose one query reads every key of ``keys`` [B, kv, S, d]: the query
    repeated over S rows (the rows do not interact), the last row sees all S keys."""
    s = keys.shape[2]
    with torch.no_grad():
        out = drafter.step(target.embed, token.expand(1, s),
                           carry.expand(1, s, carry.shape[-1]), cos.expand(s, -1),
                           sin.expand(s, -1), keys, values)
    return out[:, -1:]


def test_the_round_replay_follows_the_runtimes_loop():
    """Worked by hand: the prefill commits one token; a round from committed n drafts from
    context prompt_len + n - 2, its width capped by the budget, and commits 1 + accepted."""
    accepted = [0, 0, 2, 0, 0, 1, 0, 0, 0]  # leading drafts accepted from each context
    assert replay_rounds(accepted, 3, 6, 64, k=4) == [(4, 3), (4, 2)]
    assert replay_rounds(accepted, 3, 6, 64, k=1) == [(1, 2), (1, 1), (1, 2)]
    assert replay_rounds(accepted, 3, 6, 4, k=4) == [(2, 3)]  # max_new_tokens 4


def test_requests_lose_exact_and_near_duplicates():
    requests = [Request(t, "writing") for t in (
        "Write a poem about the sea at night.",
        "write a poem about the SEA at night!",  # the same normalized
        "Write a poem about the sea at night, please.",  # near: 3-gram Jaccard 0.75
        "Explain how a hash table works.",
        "Hi",  # too short
    )]
    kept = clean_requests(requests, min_chars=5)
    assert [r.text for r in kept] == [requests[0].text, requests[3].text]


def test_the_split_is_by_request_and_independent_of_order():
    requests = [Request(f"request number {i} about topic {i * 7}", "math") for i in range(40)]
    split = split_by_request(requests, 0.2)
    held = {r.text for r in split if r.is_held_out}
    assert len(held) == 8
    shuffled = requests[:]
    random.Random(1).shuffle(shuffled)
    assert {r.text for r in split_by_request(shuffled, 0.2) if r.is_held_out} == held


def test_the_user_turn_opener_is_the_template_up_to_the_user_content(tiny_package):
    tokenizer = Tokenizer.from_file(tiny_package / "tokenizer.json")
    chat = ChatPrompts(ChatTemplate(CHAT_TEMPLATE, "", "", "test"), tokenizer)
    opener = chat.user_turn_opener("Be brief.")
    assert tokenizer.decode(opener, skip_special_tokens=False) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert chat.request_text(tokenizer.encode("Add 2 and 3.") + [2, 5]) == ("Add 2 and 3.", True)
    assert chat.request_text(tokenizer.encode("Add 2 and")) == ("Add 2 and", False)


def test_a_checkpoint_folder_and_the_package_give_the_same_target(tmp_path, tiny_package):
    """The package's weights written back as a Hugging Face folder (``export_hf``, with the
    chat template beside) read as the same target."""
    pytest.importorskip("safetensors")
    folder = export_hf(tiny_package, tmp_path / "hf")
    shutil.copyfile(tiny_package / "tokenizer_config.json", folder / "tokenizer_config.json")
    from_package, from_folder = read_source(tiny_package), read_source(folder)
    assert from_folder.config == from_package.config
    assert from_folder.chat_template == from_package.chat_template == CHAT_TEMPLATE
    assert sorted(from_folder.weights) == sorted(from_package.weights)
    for name, array in from_package.weights.items():
        np.testing.assert_array_equal(from_folder.weights[name], array)


# -- typed errors ----------------------------------------------------------------------------
def test_a_target_without_a_chat_template_is_refused(tmp_path):
    package = write_tiny_package(tmp_path / "bare", chat_template=None)
    with pytest.raises(TrainDrafterError) as caught:
        train_drafter(package, tmp_path / "out", TrainOptions(device="cpu"))
    assert caught.value.paths == ["tokenizer_config.json: chat_template"]


def test_a_target_the_exporter_did_not_write_is_refused(tmp_path, tiny_package):
    package = tmp_path / "foreign"
    shutil.copytree(tiny_package, package)
    graph = package / "decoder" / "model.onnx"
    model = onnx.load(str(graph))
    del model.metadata_props[:]
    onnx.save(model, str(graph))
    with pytest.raises(TrainDrafterError) as caught:
        read_source(package)
    assert caught.value.paths == [f"metadata_props[{CONFIG_KEY}]"]
    assert "Llama" in str(caught.value) and str(graph) in str(caught.value)


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("lr", 0.0, "--lr"), ("held_out_fraction", 1.0, "--held-out-fraction"),
    ("device", "tpu", "--device"), ("max_steps", -1, "--max-steps"),
    ("features", "eagle2", "--features")])
def test_options_out_of_range_are_refused(field, value, flag):
    with pytest.raises(TrainDrafterError) as caught:
        TrainOptions(**{field: value}).checked()
    assert caught.value.paths == [flag]


def test_resume_without_a_checkpoint_is_refused(tmp_path, tiny_package):
    with pytest.raises(TrainDrafterError) as caught:
        train_drafter(tiny_package, tmp_path / "out", TrainOptions(device="cpu", resume=True))
    assert caught.value.paths == ["--resume"]
