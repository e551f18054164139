"""`scale-target --shape`: the trained pair widened to a real model's shape by zero padding
that keeps its function (export/widen.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS

from speculant_tools.export import ExportError, LlamaConfig, read_weights
from speculant_tools.export.cost_scale import prefill_logits, scale_target
from speculant_tools.export.widen import SHAPES, widen_weights, widened_config

DEMO = Path(__file__).resolve().parents[2] / "src" / "speculant" / "demo"
# The demo target (hidden 192, 6 heads of 32 over 2 KV heads, 5 layers, MLP 512) widened in
# every dimension: hidden 256, groups 3 -> 4, head size x2, one more layer, MLP 768.
SMALL = {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 8,
         "num_key_value_heads": 2, "intermediate_size": 768, "head_dim": 64}


def test_the_realistic_1b_shape():
    demo = LlamaConfig(vocab_size=4096, hidden_size=192, num_hidden_layers=5,
                       num_attention_heads=6, num_key_value_heads=2, intermediate_size=512,
                       max_position_embeddings=512, head_dim=32, rms_norm_eps=1e-5)
    wide = widened_config(demo, "realistic-1b")
    assert (wide.hidden_size, wide.num_hidden_layers, wide.num_attention_heads,
            wide.num_key_value_heads, wide.intermediate_size, wide.head_dim) == (
        2048, 16, 32, 8, 8192, 64)
    assert wide.rms_norm_eps == pytest.approx(demo.rms_norm_eps * 192 / 2048)
    assert wide.drafter_intermediate_size == 512  # the drafter keeps its MLP width
    assert set(SHAPES) == {"realistic-1b"}


def test_shapes_that_cannot_keep_the_function_are_refused():
    with pytest.raises(ExportError, match="head_dim must be a multiple"):
        widened_config(CONFIG, {"head_dim": 24})
    with pytest.raises(ExportError, match="groups"):  # 4 heads over 2 KV -> 4 over 4
        widened_config(CONFIG, {"num_key_value_heads": 4})
    with pytest.raises(ExportError, match="hidden_size"):
        widened_config(CONFIG, {"hidden_size": 8})
    with pytest.raises(ExportError, match="unknown shape"):
        widened_config(CONFIG, "realistic-7b")


def test_the_padding_is_zero_where_it_must_be():
    wide = widened_config(CONFIG, {"hidden_size": 32, "num_attention_heads": 8,
                                   "num_key_value_heads": 4, "head_dim": 32,
                                   "num_hidden_layers": 3, "intermediate_size": 64})
    target, drafter = widen_weights(CONFIG, TARGET_WEIGHTS, DRAFTER_WEIGHTS, wide)
    h = CONFIG.hidden_size
    assert not target["model.embed_tokens.weight"][:, h:].any()  # residual extras stay 0
    for i in range(3):
        assert not target[f"model.layers.{i}.self_attn.o_proj.weight"][h:].any()
        assert not target[f"model.layers.{i}.mlp.down_proj.weight"][h:].any()
        assert not target[f"model.layers.{i}.mlp.down_proj.weight"][:, 40:].any()
    added = "model.layers.1"  # before the trained last layer
    assert not target[f"{added}.self_attn.o_proj.weight"].any()
    assert target[f"{added}.self_attn.q_proj.weight"].any()  # real work, no effect
    norm = target["model.layers.0.input_layernorm.weight"]
    np.testing.assert_allclose(norm[:h], TARGET_WEIGHTS["model.layers.0.input_layernorm.weight"]
                               * np.sqrt(h / 32), rtol=1e-6)
    assert not drafter["drafter.in_proj.weight"][h:].any()


def test_a_widened_demo_pair_keeps_the_trained_function(tmp_path):
    """hidden 192 -> 256 (and heads, head size, layers, MLP): prefill logits within float32
    rounding, greedy tokens and the chained trace (drafts accepted) equal the trained pair's
    (scale_target raises otherwise)."""
    result = scale_target(DEMO, tmp_path / "wide", shape=SMALL, check_tokens=16)
    check = result.check
    assert check["max_abs_logit_diff"] < 1e-3 * check["max_abs_logit"]
    assert check["greedy_equal"] and check["chained_trace_equal"]
    assert check["chained_mean_accepted_length"] > 1.5  # the widened drafter drafts well
    config, target, drafter = read_weights(tmp_path / "wide")
    assert config.hidden_size == 256 and config.head_dim == 64
    assert drafter["drafter.in_proj.weight"].shape == (256, 512)


def test_a_widened_pair_can_be_written_with_static_caches(pair_root, tmp_path):
    result = scale_target(pair_root, tmp_path / "wide", shape={
        "hidden_size": 32, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 32}, cache="static", check_tokens=8)
    assert result.check["greedy_equal"] and result.check["chained_trace_equal"] is None
    np.testing.assert_allclose(prefill_logits(tmp_path / "wide", [7, 3, 41]),
                               prefill_logits(pair_root, [7, 3, 41]), rtol=1e-4, atol=1e-4)


def test_a_defective_widening_is_caught(tmp_path, pair_root, monkeypatch):
    """Planted defect: the norm weights not rescaled for the padded width. The check sees
    the logits move and scale_target refuses the package."""
    from speculant_tools.export import widen

    monkeypatch.setattr(widen._Layout, "__init__", _unscaled_layout(widen._Layout.__init__))
    with pytest.raises(ExportError, match="decodes differently"):
        scale_target(pair_root, tmp_path / "wide", shape={"hidden_size": 64}, check_tokens=8)


def _unscaled_layout(original):
    def init(self, c, w):
        original(self, c, w)
        self.norm_scale = 1.0
    return init


def test_the_shape_option_of_scale_target(pair_root, tmp_path):
    from typer.testing import CliRunner

    from speculant.cli import full_app

    refused = CliRunner().invoke(full_app(), ["scale-target", str(pair_root),
                                              str(tmp_path / "out"), "--shape", "realistic-7b"])
    assert refused.exit_code == 2 and "unknown shape" in refused.stderr
    assert "realistic-1b" in refused.stderr and "Traceback" not in refused.output
