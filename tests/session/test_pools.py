"""The process's one CPU thread pool (`session/pools.py`): the decision with a fake maker of
ORT's process-wide pools, then real engines in fresh processes (the pools are made once per
process, so each case gets its own interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builders.writers import write_chained_package
from speculant.session.pools import NOT_ALLOWED, PoolDecision, ProcessPool

NOT_APPLIED = "not applied: ONNX Runtime gives no session its own pool once this one exists"


def allowed(maker) -> ProcessPool:
    pools = ProcessPool(maker)
    pools.allow()  # as the process's owner does (the console script)
    return pools


class FakeMaker:
    """Records each call; raises ``error`` (ORT's refusal) when given one."""

    def __init__(self, error: str = "") -> None:
        self.calls: list[tuple[int, int]] = []
        self.error = error

    def __call__(self, intra: int, inter: int) -> None:
        self.calls.append((intra, inter))
        if self.error:
            raise RuntimeError(self.error)


def test_the_first_session_makes_the_pool_and_the_same_threads_share_it():
    maker = FakeMaker()
    pools = allowed(maker)
    shared = PoolDecision(True, "2 threads, spinning between runs")
    assert pools.decide(2) == shared and pools.decide(2) == shared
    assert maker.calls == [(2, 1)]  # made once, sized as asked, one inter-op thread
    assert shared.describe("the target") == \
        "shared by the target (2 threads, spinning between runs)"


def test_a_library_process_makes_no_pool_unless_allowed():
    maker = FakeMaker()
    pools = ProcessPool(maker)  # another ORT session of the process would be refused its own
    assert pools.decide(2) == PoolDecision(False, NOT_ALLOWED) and pools.decide(None) == \
        PoolDecision(False, NOT_ALLOWED)
    assert maker.calls == [] and not pools.exists
    assert pools.decide(1).describe() == "per session (threads=1: no pool)"
    pools.allow()
    assert pools.decide(2).is_shared and maker.calls == [(2, 1)]


def test_the_default_threads_make_a_pool_of_ort_default_size():
    maker = FakeMaker()
    assert allowed(maker).decide(None) == PoolDecision(
        True, "ONNX Runtime's default size, spinning between runs")
    assert maker.calls == [(0, 1)]


def test_one_thread_makes_no_pool():
    maker = FakeMaker()
    pools = allowed(maker)
    decision = pools.decide(1)
    assert decision.describe() == "per session (threads=1: no pool)"
    assert maker.calls == [] and not pools.exists


@pytest.mark.parametrize("threads", [1, 4, None])
def test_a_count_other_than_the_pools_runs_on_it_and_says_so(threads):
    pools = allowed(FakeMaker())
    pools.decide(2)
    assert pools.decide(threads) == PoolDecision(
        True, f"2 threads, spinning between runs; threads={threads} {NOT_APPLIED}")


def test_pools_made_outside_speculant_are_shared_and_named():
    maker = FakeMaker("Global thread pools have already been created, cannot replace them")
    pools = allowed(maker)
    outside = "ONNX Runtime's process-wide pools, made outside speculant: their size unknown"
    assert pools.decide(2).detail == f"{outside} here; threads=2 {NOT_APPLIED}"
    assert pools.decide(None) == PoolDecision(True, f"{outside} here")
    assert pools.decide(1).is_shared  # ORT refuses a per-session pool beside them
    assert maker.calls == [(2, 1)] and pools.exists


def test_a_refused_pool_leaves_every_session_its_own_and_says_why():
    maker = FakeMaker("no such thing")
    pools = allowed(maker)
    assert pools.decide(2) == PoolDecision(
        False, "ONNX Runtime refused process-wide pools: no such thing")
    assert pools.decide(2).describe().startswith("per session (ONNX Runtime refused")
    assert maker.calls == [(2, 1)] and not pools.exists  # asked once, never retried


# -- real engines, each case in a fresh process -----------------------------------------------
PROBE = """
import json, sys
import onnxruntime as ort
import speculant
if sys.argv[2] == "outside":
    ort.set_global_thread_pool_sizes(1, 1)
if sys.argv[2] != "library":
    speculant.share_cpu_pool()  # as the console script does
report = []
for threads in json.loads(sys.argv[3]):
    engine = speculant.load(sys.argv[1], threads=threads)
    options = [s.session.get_session_options() for s in engine.sessions.values()]
    result = engine.generate([3, 1, 4, 1, 5], 12, speculative=True, k=2, stop_on_eos=False)
    report.append({"pool": engine.cpu_pool, "stats": result.stats.cpu_pool,
                   "per_session": [o.use_per_session_threads for o in options],
                   "intra": [o.intra_op_num_threads for o in options],
                   "tokens": result.token_ids})
try:  # the pools exist exactly where ORT refuses to make them again
    ort.set_global_thread_pool_sizes(2, 1)
    report.append("no pools")
except Exception as exc:
    report.append("pools exist" if "already" in str(exc) else str(exc))
print(json.dumps(report))
"""


def probe(root, threads: list, process: str = "owned") -> list:
    done = subprocess.run([sys.executable, "-c", PROBE, str(root), process, json.dumps(threads)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_chained_package(tmp_path_factory.mktemp("pools") / "pair", fmt="onnx")


def test_engines_of_one_process_share_the_pool_the_first_made(pair):
    alone, shared, again, other, pools = probe(pair, [1, 2, 2, 3])
    assert alone["pool"] == "per session (threads=1: no pool)"  # made before the pool
    assert alone["per_session"] == [True, True] and alone["intra"] == [1, 1]
    named = "shared by the target and the assistant"
    assert shared["pool"] == again["pool"] == f"{named} (2 threads, spinning between runs)"
    assert other["pool"] == f"{named} (2 threads, spinning between runs; threads=3 {NOT_APPLIED})"
    for engine in (shared, again, other):
        assert engine["per_session"] == [False, False] and engine["stats"] == engine["pool"]
        assert engine["tokens"] == alone["tokens"]
    assert pools == "pools exist"  # a session off per-session threads never lacks the pool


def test_pools_made_outside_speculant_are_shared_and_reported(pair):
    (engine, pools) = probe(pair, [2], "outside")
    assert engine["pool"].startswith("shared by the target and the assistant (ONNX Runtime's "
                                     "process-wide pools, made outside speculant")
    assert engine["per_session"] == [False, False] and pools == "pools exist"


def test_a_library_process_keeps_per_session_pools_and_ort_its_rules(pair):
    (engine, pools) = probe(pair, [2], "library")
    assert engine["pool"] == engine["stats"] == f"per session ({NOT_ALLOWED})"
    assert engine["per_session"] == [True, True] and engine["intra"] == [2, 2]
    assert pools == "no pools"  # a program's own sessions keep their own pools too


def test_the_console_script_allows_the_pool(pair):
    done = subprocess.run([sys.executable, "-c", "import sys; from speculant.cli import main; "
                           "sys.argv[0] = 'speculant'; main()", "generate", str(pair), "--prompt",
                           "hi", "--max-new-tokens", "4", "--threads", "2", "--stats"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "CPU thread pool: shared by the target and the assistant (2 threads" in done.stderr
