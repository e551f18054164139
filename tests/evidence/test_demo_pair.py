"""The real-pair gate (evidence.md §4), package-agnostic, on two pairs.

``pair``: ``SPECULANT_EVIDENCE_PAIR`` (a chained pair's root; default: the bundled demo
package), with ``SPECULANT_EVIDENCE_TARGET`` (the standalone target's root; default: the pair
itself, decoded without a proposer). ``smollm2`` (marked ``smollm2``): the built-in package,
the real SmolLM2-135M-Instruct with its trained chained drafter, against its own greedy
decode. ``SPECULANT_EVIDENCE_DEVICE`` picks ``cpu`` (default) or ``cuda``. With
``SPECULANT_REQUIRE_EVIDENCE=1`` a missing package, an unset variable or partial width
coverage fails instead of skipping. All geometry comes from the package's plan and graphs.

Beyond G1..G6 at k ∈ {1, 2, 4}: the same at k = 8 where the package allows it, G1 at
``k="auto"``, a mean accepted length floor where one is stated from measurement, and the two
defects onnx-genai found on its real pair, planted with monkeypatch: a borrowed cache that is
not the target's live one, and the embedding scale left out. Each must lower acceptance
measurably while the output still equals greedy (verification only commits the target's
tokens).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import speculant
from speculant.speculative import chain_graph
from speculant.speculative.chained import ChainedProposer, read_table
from speculant.workflow.cells import StaticPool
from speculant.workflow.target_pass import TargetPass

STRICT = os.environ.get("SPECULANT_REQUIRE_EVIDENCE") == "1"
WIDTHS = (1, 2, 4)  # the gate's widths (evidence.md §4)
MORE_WIDTHS = (8, "auto")  # run where the package allows them, never required
NUM_TOKENS = 32  # >= 24 greedy tokens per width (evidence.md §4)
SMOLLM2_TOKENS = 24  # per prompt, 3 prompts: the real model stays within CI's time
DEVICE = os.environ.get("SPECULANT_EVIDENCE_DEVICE", "cpu")
CHAT_PROMPTS = (  # user messages, for a package with a chat template and no val_prompts.json
    "Write a Python function that reverses a list.",
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is, in two sentences.",
)
# Mean accepted length at k = 4 over the gate's prompts (pooled over rounds), the floor
# stated well below what was measured (2026-12-02, CPU).
ACCEPTANCE_FLOORS = {
    # 2.03 measured with the 2026-12-02 drafter (3 chat prompts x 24 tokens;
    # per prompt 2.56, 1.92, 1.77); a drafter whose drafts are never confirmed scores 1.0.
    "smollm2": 1.5,
    # 2.09 measured (the bundled demo pair, its first 4 val_prompts.json prompts).
    "demo": 1.7,
}
# The planted defects are measured at k = 1, where the mean accepted length is one plus the
# share of first drafts confirmed (G2's statistic), and where a broken drafter costs least.
# A defect keeps at most DEFECT_GAIN_SHARE of the healthy pair's gain over one token per pass
# (mean accepted length - 1). Measured (2026-12-02, CPU) at k = 1: smollm2 healthy 1.58,
# zeroed borrowed cache 1.05 (share 0.08), unscaled table 1.10 (0.17); demo healthy 1.54,
# zeroed 1.30 (0.55: its carry alone still predicts), unscaled 1.17 (0.31).
DEFECT_WIDTH = 1
DEFECT_GAIN_SHARE = 2 / 3


def _skip_or_fail(reason: str):
    if STRICT:
        pytest.fail(f"SPECULANT_REQUIRE_EVIDENCE=1: {reason}")
    pytest.skip(reason)


def _configured_root() -> Path:
    root = os.environ.get("SPECULANT_EVIDENCE_PAIR")
    path = Path(root) if root else Path(str(resources.files("speculant") / "demo"))
    if not (path / "inference_metadata.yaml").is_file():
        _skip_or_fail(f"no chained pair at {path} (set SPECULANT_EVIDENCE_PAIR)")
    return path


def _load(root: Path | str) -> speculant.Engine:
    return speculant.load(root, DEVICE, use_tf32=False) if DEVICE != "cpu" \
        else speculant.load(root)


def _prompts(pair: speculant.Engine) -> list[list[int]]:
    """Validation prompts shipped beside the package, else chat prompts rendered by its chat
    template, else a few code snippets."""
    stored = pair.package.root / "val_prompts.json"
    if stored.is_file():
        return [p["prompt"][:48] for p in json.loads(stored.read_text())["prompts"][:4]]
    if pair.chat_template is not None:
        return [pair.tokenizer.encode(pair.render_chat([{"role": "user", "content": text}]))
                for text in CHAT_PROMPTS]
    texts = ["def ", "import os\n", "class Point:\n    def __init__(self, x, y):\n"]
    return [pair.tokenizer.encode(t) for t in texts] if pair.tokenizer.has_text else [[2, 3]]


class Pair:
    """One pair under the gate: its engines, prompts and greedy references, and each width's
    speculative decodes, made once per module (the healthy decodes at DEFECT_WIDTH are the
    baseline the planted defects are measured against)."""

    def __init__(self, name: str, engine: speculant.Engine, standalone: speculant.Engine,
                 num_tokens: int = NUM_TOKENS) -> None:
        self.name = name  # "smollm2", "demo", or the configured pair's root
        self.engine = engine
        self.standalone = standalone
        self.num_tokens = num_tokens  # per prompt, every decode
        self.prompts = _prompts(engine)
        self.references = [standalone.generate(p, num_tokens, stop_on_eos=False).token_ids
                           for p in self.prompts]
        self._runs: dict[int | str, list] = {}

    def speculative(self, k: int | str) -> list:
        """Each prompt's Generation at width ``k``, decoded now."""
        return [self.engine.generate(p, self.num_tokens, speculative=True, k=k,
                                     stop_on_eos=False) for p in self.prompts]

    def healthy(self, k: int | str, *, fresh: bool = False) -> list:
        """:meth:`speculative` of the unmodified pair, kept for later tests (``fresh``:
        decoded again now, under the caller's instrumentation)."""
        if fresh or k not in self._runs:
            self._runs[k] = self.speculative(k)
        return self._runs[k]


def mean_accepted_length(runs) -> float:
    """Tokens committed per verification pass, pooled over the rounds of every run."""
    lengths = [a for run in runs for _, a in run.stats.trace]
    assert lengths, "no speculative round ran"
    return sum(lengths) / len(lengths)


def _smollm2_pair(request) -> Pair:
    """The built-in package against its own greedy decode."""
    from speculant_tools.builtin import BuiltinError, smollm2_gguf

    try:
        smollm2_gguf(download=False)
    except BuiltinError as error:
        _skip_or_fail(f"the SmolLM2 GGUF is not on this machine: {error}")
    engine = _load("smollm2") if DEVICE != "cpu" else request.getfixturevalue("smollm2_engine")
    return Pair("smollm2", engine, engine, SMOLLM2_TOKENS)


def _configured_pair(request) -> Pair:
    """SPECULANT_EVIDENCE_PAIR (default: the demo) against SPECULANT_EVIDENCE_TARGET."""
    engine = _load(_configured_root())
    target = os.environ.get("SPECULANT_EVIDENCE_TARGET")
    if target and not (Path(target) / "inference_metadata.yaml").is_file():
        _skip_or_fail(f"SPECULANT_EVIDENCE_TARGET={target} holds no package")
    name = str(engine.package.root) if os.environ.get("SPECULANT_EVIDENCE_PAIR") else "demo"
    return Pair(name, engine, speculant.load(target) if target else engine)


@pytest.fixture(scope="module", params=[
    pytest.param(_configured_pair, id="pair"),
    pytest.param(_smollm2_pair, id="smollm2", marks=pytest.mark.smollm2)])
def pair(request) -> Pair:
    made = request.param(request)
    if made.engine.package.plan.chain is None:
        _skip_or_fail(f"{made.engine.package.root} declares no chained proposer")
    return made


def _bound(pair: Pair) -> int:
    return pair.engine.package.plan.rollback_bound or 0


def test_widths_are_covered(pair):
    missing = [k for k in WIDTHS if k > _bound(pair)]
    if missing:
        _skip_or_fail(f"max_proposal_width {_bound(pair)} does not cover widths {missing}")


@pytest.mark.parametrize("k", [*WIDTHS, *MORE_WIDTHS])
def test_gate(pair, k, monkeypatch):
    if isinstance(k, int) and k > _bound(pair):
        if k in WIDTHS:
            _skip_or_fail(f"width {k} exceeds max_proposal_width")
        pytest.skip(f"width {k} exceeds max_proposal_width {_bound(pair)}")
    seeds_seen: list[bool] = []
    run_pass = TargetPass.run

    def recording_run(self, *args, **kwargs):
        result = run_pass(self, *args, **kwargs)
        seeds_seen.append(result.seed is not None)  # G5: the seed is in every pass
        return result

    monkeypatch.setattr(TargetPass, "run", recording_run)
    totals = dict(rounds=0, first=0, proposed=0, rejected=0, rollbacks=0)
    for run, reference in zip(pair.healthy(k, fresh=True), pair.references, strict=True):
        assert run.token_ids == reference  # G1
        stats = run.stats
        totals["rounds"] += stats.rounds
        totals["first"] += stats.rounds_with_first_draft_accepted
        totals["proposed"] += stats.drafts_proposed
        totals["rejected"] += stats.rejected_drafts
        totals["rollbacks"] += stats.rollbacks
        if DEVICE != "cpu":  # G6
            rows = 1 + stats.greedy_steps + sum(2 * kr + 1 for kr, _ in stats.trace)
            assert stats.residency["host_staging_count"] == 0
            assert stats.argmax_rows == rows
    assert seeds_seen and all(seeds_seen)  # G5
    if k == "auto":  # its width follows acceptance; it need not draft, nor miss, every time
        assert totals["rounds"] > 0, totals
        return
    assert 4 * totals["first"] >= totals["rounds"], totals  # G2
    assert totals["proposed"] > 0 and totals["rejected"] > 0 and totals["rollbacks"] > 0  # G3


def test_embedding_table_is_real_and_of_the_declared_width(pair):
    """G4: the declared table is not all zeros and has width W_E = W_F - W_C."""
    chain = pair.engine.package.plan.chain
    host = read_table(pair.engine.package, chain)  # from the artifact, not the mirror
    assert np.any(host != 0)
    assert chain.fused_width is None or chain.carry_width is None or \
        host.shape[1] == chain.fused_width - chain.carry_width


def test_mean_accepted_length_at_k4_is_above_its_floor(pair):
    floor = ACCEPTANCE_FLOORS.get(pair.name)
    if floor is None:
        pytest.skip(f"no acceptance floor is stated for {pair.name} (G2 is its floor)")
    if _bound(pair) < 4:
        _skip_or_fail("width 4 exceeds max_proposal_width")
    measured = mean_accepted_length(pair.healthy(4))
    assert measured >= floor, f"{pair.name}: mean accepted length {measured:.2f} at k=4"


# -- the planted defects: each must lower acceptance, and the output must not change ----------
def plant_zeroed_borrowed_cache(monkeypatch, pair: Pair) -> None:
    """The drafter reads a zeroed buffer through its read-only aliases instead of the
    target's live last-layer KV cells (a borrowed cache that is never the owner's). On static
    caches the drafter's plan binds what the first proposal was given, so the planted run
    gets buffers and plans of its own (and leaves none behind for the healthy runs)."""
    fixed_bindings = ChainedProposer._fixed_bindings

    def zeroed(self, state, into=None):
        fixed = fixed_bindings(self, state, into)
        for port in self.chain.borrowed:
            live = fixed[port]
            fixed[port] = self.seam.zeros(live.shape, live.dtype, live.residency)
        return fixed

    monkeypatch.setattr(ChainedProposer, "_fixed_bindings", zeroed)
    monkeypatch.setattr(pair.engine, "static_pool", StaticPool())


def plant_unscaled_table(monkeypatch, pair: Pair) -> None:
    """The drafter fed the stored rows: ``token_embedding.scale`` left out of the step graph
    (made at load: the planted run gets an engine of its own)."""
    if pair.engine.package.plan.chain.scale in (None, 1.0):
        pytest.skip(f"{pair.name} declares no embedding scale to leave out")
    monkeypatch.setattr(chain_graph, "row_scale", lambda chain: None)
    monkeypatch.setattr(pair, "engine", _load(pair.engine.package.root))


@pytest.mark.parametrize("defect", ["zeroed_borrowed_cache", "unscaled_embedding_table"])
def test_a_planted_defect_lowers_acceptance_and_not_the_output(pair, defect, monkeypatch):
    healthy = mean_accepted_length(pair.healthy(DEFECT_WIDTH))  # before planting
    if defect == "zeroed_borrowed_cache":
        plant_zeroed_borrowed_cache(monkeypatch, pair)
    else:
        plant_unscaled_table(monkeypatch, pair)
    runs = pair.speculative(DEFECT_WIDTH)
    assert [run.token_ids for run in runs] == pair.references  # verification still holds
    defective = mean_accepted_length(runs)
    assert defective - 1 <= DEFECT_GAIN_SHARE * (healthy - 1), \
        f"{pair.name}, {defect}: mean accepted length {defective:.2f}, healthy {healthy:.2f}"
