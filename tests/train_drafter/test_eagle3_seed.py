"""EAGLE-3's fused carry seed (``--features eagle3``): the projection the trainer learns is
the one the exported TARGET graph computes as ``fused_hidden_states`` (every target form the
writer has), the chain is seeded from it, and a package without it is written as before."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="train-drafter needs PyTorch (the train extra)")
ort = pytest.importorskip("onnxruntime", reason="the exported graphs run in onnxruntime")

from tiny_target import CHAT_TEMPLATE, EOS_ID, SPECIALS, TOKENS, tokenizer_json  # noqa: E402

from speculant.package.document import find_metadata, parse_text  # noqa: E402
from speculant_tools.export import (  # noqa: E402
    ExportError,
    LlamaConfig,
    convert,
    export_hf,
    read_weights,
    target_shapes,
)
from speculant_tools.export.graphs import FUSED_SEED  # noqa: E402
from speculant_tools.importers import (  # noqa: E402
    Checkpoint,
    Drafter,
    ImporterError,
    read_drafter,
    write_checkpoint,
)
from speculant_tools.importers.checkpoint import tokenizer_config  # noqa: E402
from speculant_tools.train_drafter.drafter import ChainedDrafter, eagle3_layers  # noqa: E402
from speculant_tools.train_drafter.llama import TorchLlama  # noqa: E402

# head_dim 16: the fused (GroupQueryAttention) target takes it; three layers: three streams
CONFIG = LlamaConfig(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=3,
                     num_attention_heads=2, num_key_value_heads=1, intermediate_size=48,
                     max_position_embeddings=64, head_dim=16, rms_norm_eps=1e-5)
LAYERS = (0, 2, 3)  # the embeddings, a middle stream, the last layer's output
IDS = [[1, 10, 33, 40, 5, 61, 7, 20, 21], [3, 44, 45, 12, 12, 70, 8, 9, 30]]
CAPACITY = 16


def random_weights(seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else
                   rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            for name, shape in target_shapes(CONFIG).items()}


@pytest.fixture(scope="module")
def pair():
    """The torch target and a drafter whose seed projection is away from its start."""
    target = TorchLlama(CONFIG, random_weights())
    torch.manual_seed(0)
    drafter = ChainedDrafter(CONFIG, 48, LAYERS)
    drafter.init_from_target(target, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for parameter in drafter.fusion.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return target, drafter


def write(folder, target, drafter, dtype="float32", **form):
    checkpoint = Checkpoint(config=CONFIG, weights=random_weights(),
                            tokenizer_json=tokenizer_json(),
                            tokenizer_config=tokenizer_config(CHAT_TEMPLATE, SPECIALS[1],
                                                              SPECIALS[2]),
                            eos_id=EOS_ID, source="three-layer")
    shipped = None if drafter is None else Drafter(
        weights=drafter.export_arrays(), intermediate_size=drafter.intermediate_size,
        seed_feature_layers=drafter.seed_feature_layers)
    return write_checkpoint(checkpoint, folder, dtype=dtype, drafter=shipped, **form)


def run_target(path, ids: np.ndarray, static: bool, dtype=np.float32) -> dict[str, np.ndarray]:
    """One pass over ``ids`` [B, T] from empty caches; the outputs by name."""
    session = ort.InferenceSession(str(path))
    rows, length = ids.shape
    width = CAPACITY if static else 0
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.tile(np.arange(length, dtype=np.int64), (rows, 1)),
             "cache_lengths": np.zeros(rows, np.int64),
             "block_lengths": np.full(rows, length, np.int64)}
    cache = np.zeros((rows, CONFIG.num_key_value_heads, width, CONFIG.head_dim), dtype)
    names = [i.name for i in session.get_inputs()]
    feeds = {name: feeds.get(name, cache) for name in names}
    outputs = [o.name for o in session.get_outputs()]
    return dict(zip(outputs, session.run(None, feeds), strict=True))


def metadata(root) -> dict:
    path = find_metadata(root)
    return parse_text(path.read_text(), str(path), is_json=False)


def seed_of(target, drafter, ids) -> np.ndarray:
    with torch.no_grad():
        return drafter.seed(target.features(torch.tensor(ids), drafter.stream_layers)).numpy()


@pytest.mark.parametrize(("graph", "cache", "batch", "dtype"), [
    ("explicit", "appended", None, "float32"), ("explicit", "static", None, "float32"),
    ("fused", "appended", None, "float32"), ("fused", "static", None, "float32"),
    ("explicit", "static", 2, "float32"), ("fused", "static", None, "float16")])
def test_the_targets_fused_seed_equals_the_trainers(tmp_path, pair, graph, cache, batch,
                                                     dtype):
    """Within 1e-5 in float32; the float16 fused form (the GPU's) within float16's rounding."""
    target, drafter = pair
    root = write(tmp_path / "pair", target, drafter, dtype, graph=graph, cache=cache,
                 batch=batch)
    is_static = cache == "static"
    passes = [("model.onnx", IDS[:1])] + ([("batched.onnx", IDS)] if batch else [])
    for artifact, ids in passes:
        outputs = run_target(root / "target" / artifact, np.array(ids, np.int64), is_static,
                             np.dtype(dtype))
        expected = seed_of(target, drafter, ids)
        assert outputs[FUSED_SEED].shape == expected.shape
        np.testing.assert_allclose(outputs[FUSED_SEED].astype(np.float32), expected,
                                   atol=1e-5 if dtype == "float32" else 3e-2, rtol=0)
    document = metadata(root)
    chain = document["speculative"]["proposal_execution"]
    assert chain["folded_carry_seed"] == {"component": "target", "output": FUSED_SEED}
    workflow = document["pipeline"]["workflow"]
    assert FUSED_SEED in workflow["components"]["target"]["ports"]["outputs"]
    assert workflow["steps"][0]["outputs"][FUSED_SEED] == f"target.{FUSED_SEED}"


def test_a_fused_pair_reads_back_and_converts_with_its_seed(tmp_path, pair):
    target, drafter = pair
    root = write(tmp_path / "pair", target, drafter, cache="static")
    config, _, weights = read_weights(root)
    assert config.seed_feature_layers == LAYERS
    for name, array in drafter.export_arrays().items():
        np.testing.assert_array_equal(weights[name], array)
    converted = convert(root, tmp_path / "appended", dtype="float32", cache="appended")
    outputs = run_target(converted / "target" / "model.onnx", np.array(IDS[:1]), False)
    np.testing.assert_allclose(outputs[FUSED_SEED], seed_of(target, drafter, IDS[:1]),
                               atol=1e-5, rtol=0)
    safetensors = pytest.importorskip("safetensors")
    hf = export_hf(root, tmp_path / "hf")
    with safetensors.safe_open(hf / "drafter.safetensors", "np") as written:
        assert json.loads(written.metadata()["seed_feature_layers"]) == list(LAYERS)
        assert "drafter.seed_fusion.fc.weight" in written.keys()


def test_a_pair_without_fusion_seeds_from_the_hidden_state(tmp_path, pair):
    target, _ = pair
    plain = ChainedDrafter(CONFIG, 48)
    root = write(tmp_path / "pair", target, plain, cache="static")
    outputs = run_target(root / "target" / "model.onnx", np.array(IDS[:1]), True)
    assert FUSED_SEED not in outputs
    document = metadata(root)
    seed = document["speculative"]["proposal_execution"]["folded_carry_seed"]
    assert seed == {"component": "target", "output": "hidden_states"}
    assert "seed_feature_layers" not in CONFIG.to_json()


def test_at_step_zero_the_fused_seed_is_the_last_layers_hidden_state():
    """The fusion starts as the ``last`` seed, so training starts where ``last`` does."""
    target = TorchLlama(CONFIG, random_weights())
    drafter = ChainedDrafter(CONFIG, 48, eagle3_layers(CONFIG.num_hidden_layers))
    drafter.init_from_target(target, torch.Generator().manual_seed(0))
    with torch.no_grad():
        state = target.features(torch.tensor(IDS), drafter.stream_layers)
        np.testing.assert_allclose(drafter.seed(state).numpy(), state.hidden.numpy(),
                                   atol=1e-4, rtol=0)


def test_the_layer_choice_is_eagle3s_low_and_middle_and_the_last_output():
    assert eagle3_layers(30) == (2, 15, 30)  # SmolLM2-135M
    assert eagle3_layers(16) == (2, 8, 16)
    assert eagle3_layers(2) == (1, 1, 2)


@pytest.mark.parametrize("layers", [[], [0, 4], ["1"], [True], 3])
def test_bad_seed_layers_are_refused_by_field(tmp_path, pair, layers):
    _, drafter = pair
    np.savez(tmp_path / "drafter.npz", **drafter.export_arrays())
    (tmp_path / "drafter_config.json").write_text(json.dumps({"seed_feature_layers": layers}))
    with pytest.raises(ImporterError) as refused:
        read_drafter(tmp_path, CONFIG)
    assert "seed_feature_layers" in str(refused.value)
    with pytest.raises(ExportError, match="seed_feature_layers"):
        LlamaConfig(**{**json.loads(CONFIG.to_json()), "seed_feature_layers": layers})


@pytest.mark.parametrize(("graph", "cache"), [("explicit", "appended"), ("fused", "appended"),
                                              ("fused", "static")])
def test_the_runtime_runs_a_fused_pair_unchanged(tmp_path, pair, graph, cache):
    """The runtime seeds the chain from whatever output the metadata binds: every form of a
    fused pair loads and speculates exactly greedy, its drafts counted."""
    import speculant

    target, drafter = pair
    engine = speculant.load(write(tmp_path / "pair", target, drafter, graph=graph,
                                  cache=cache))
    for k in (1, 4):
        plain = engine.generate(IDS[0], 16, stop_on_eos=False).token_ids
        run = engine.generate(IDS[0], 16, stop_on_eos=False, speculative=True, k=k)
        assert run.token_ids == plain and run.stats.drafts_proposed > 0


def test_the_scheduler_drafts_a_fused_pairs_rows_together_as_greedy(tmp_path, pair):
    """The batched pass (batched.onnx) carries the fused seed too: chained rows decoded
    together equal each prompt's greedy output."""
    import speculant

    target, drafter = pair
    engine = speculant.load(write(tmp_path / "pair", target, drafter, cache="static",
                                  batch=2))
    prompts = [IDS[0], IDS[1][:5]]
    plain = [engine.generate(p, 12, stop_on_eos=False).token_ids for p in prompts]
    options = [speculant.GenerationOptions(max_new_tokens=12, stop_on_eos=False,
                                           proposer="chained", k=k) for k in (2, 4)]
    together = engine.generate_many(prompts, options)
    assert [g.token_ids for g in together] == plain
    assert sum(g.stats.drafts_proposed for g in together) > 0
