"""The metadata fuzzer as a test (issue 15): every mutated document either loads or raises a
SpeculantError, within the per-input limit, with a bounded message.

The suite runs a small derandomized budget (well under 20 s). A longer, random run:

    SPECULANT_FUZZ_EXAMPLES=20000 SPECULANT_FUZZ_REPORT=docs/evidence/fuzz-metadata.json \\
        uv run --extra cpu pytest -q tests/hostile/test_hostile_fuzz.py

writes its figures (inputs tried, typed errors, accepted, uncaught, hangs) to the report.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from metadata_fuzz import LIMIT_S, MAX_MESSAGE_CHARS, inputs, run_input, seed_documents

NUM_EXAMPLES = int(os.environ.get("SPECULANT_FUZZ_EXAMPLES", "120"))
REPORT = os.environ.get("SPECULANT_FUZZ_REPORT")
IS_LONG_RUN = "SPECULANT_FUZZ_EXAMPLES" in os.environ
SEEDS = seed_documents()
FULL_PACKAGE_SEEDS = {"decoder"}  # seeds whose graphs are on disk: loaded as packages too
tally: Counter[str] = Counter()
by_family: dict[str, Counter[str]] = {}
mutations: Counter[str] = Counter()  # inputs per kind of mutation or text damage
findings: list[dict] = []
slowest = [0.0]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, decoder_template):
    """A scratch folder for metadata files, and a package whose metadata each input replaces."""
    root = tmp_path_factory.mktemp("fuzz")
    package = Path(shutil.copytree(decoder_template, root / "package"))
    started = time.perf_counter()
    yield root, package
    if REPORT:
        write_report(Path(REPORT), time.perf_counter() - started)


def write_report(path: Path, seconds: float) -> None:
    report = {
        "command": f"SPECULANT_FUZZ_EXAMPLES={NUM_EXAMPLES} SPECULANT_FUZZ_REPORT={path} uv run "
                   "--extra cpu pytest -q tests/hostile/test_hostile_fuzz.py",
        "inputs_tried": sum(tally[k] for k in ("accepted", "typed", "uncaught", "hang")),
        "typed_errors": tally["typed"], "accepted": tally["accepted"],
        "uncaught": tally["uncaught"], "hangs": tally["hang"],
        "full_package_loads": tally["full_package"],
        "per_input_limit_s": LIMIT_S, "slowest_input_s": round(slowest[0], 3),
        "largest_message_chars": tally["largest_message"],
        "outcomes_by_seed": {k: dict(v) for k, v in sorted(by_family.items())},
        "inputs_by_mutation": dict(mutations.most_common()),
        "seeds": sorted(SEEDS), "wall_s": round(seconds, 1),
        "python": platform.python_version(), "findings": findings[:20],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


@settings(max_examples=NUM_EXAMPLES, deadline=None, database=None,
          derandomize=not IS_LONG_RUN, suppress_health_check=list(HealthCheck))
@given(case=inputs(SEEDS))
def test_every_fuzzed_document_loads_or_is_typed_in_time(workspace, case):
    root, package = workspace
    suffix, text, description = case
    path = root / f"input{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    mutations.update({step if step.startswith("alias bomb") else step.split(" ")[0]
                      for step in description[1:]})
    runs = [run_input(path)]
    if description[0] in FULL_PACKAGE_SEEDS:
        for old in package.glob("inference_metadata.*"):
            old.unlink()
        shutil.copy(path, package / f"inference_metadata{suffix}")
        runs.append(run_input(package, full_package=True))
        tally["full_package"] += 1
    for outcome in runs:
        tally[outcome.kind] += 1
        by_family.setdefault(description[0], Counter())[outcome.kind] += 1
        slowest[0] = max(slowest[0], outcome.seconds)
        tally["largest_message"] = max(tally["largest_message"], outcome.message_chars)
        if outcome.kind in ("uncaught", "hang") or outcome.message_chars > MAX_MESSAGE_CHARS:
            findings.append({"input": description, "outcome": outcome.kind,
                             "detail": outcome.detail[:2000]})
        assert outcome.kind in ("accepted", "typed"), (description, outcome)
        assert outcome.message_chars <= MAX_MESSAGE_CHARS, (description, outcome)
