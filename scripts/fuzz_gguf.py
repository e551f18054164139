"""A long run of the GGUF fuzzer of the test suite (``tests/importers/gguf_fuzz.py``).

Mutants of the tiny valid GGUF (written with ``gguf.GGUFWriter``) are imported one after
another (``import_model``: the header check, gguf's reader, the tensors, the tokenizer and,
for the ones accepted, the package written) until ``--seconds`` pass. Each ends ``accepted``,
``typed`` (an ImporterError), ``other-typed`` (another SpeculantError), ``internal`` (any other
exception: a bug) or ``hang`` (past the per-input limit). The report gives the counts, the
slowest input, the peak resident memory of the process and the first few internal errors;
the exit status is 1 where any input was not ``typed`` or ``accepted``.

    (ulimit -v 4000000; uv run --extra cpu python scripts/fuzz_gguf.py --seconds 170)

docs/evidence/hostile-2026-12/gguf.md holds one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "importers"))

from gguf_fuzz import (  # noqa: E402 (the fuzzer lives with the tests that run it too)
    LIMIT_S,
    header_end,
    header_slots,
    mutants,
    run_input,
    seed_file,
)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=170.0)
    parser.add_argument("--seed", type=int, default=1, help="the mutation generator's seed")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-") as scratch:
        folder = Path(scratch)
        seed = seed_file(folder / "seed.gguf")
        slots, end, data = header_slots(seed), header_end(seed), seed.read_bytes()
        baseline = run_input(seed, folder / "out")
        assert baseline.kind == "accepted", baseline.detail
        rss_after_seed = peak_rss_mb()
        outcomes: Counter[str] = Counter()
        internal: list[str] = []
        slowest = (0.0, -1)
        started = time.monotonic()
        for index, mutant in enumerate(mutants(data, slots, end, args.seed)):
            if time.monotonic() - started > args.seconds:
                break
            path = folder / "mutant.gguf"
            path.write_bytes(mutant)
            outcome = run_input(path, folder / "out")
            outcomes[outcome.kind] += 1
            slowest = max(slowest, (outcome.seconds, index))
            if outcome.kind not in ("typed", "accepted") and len(internal) < 10:
                internal.append(f"mutant {index}: {outcome.kind}: {outcome.detail}")
    report = {"seconds": round(time.monotonic() - started, 1), "generator_seed": args.seed,
              "inputs": sum(outcomes.values()), "typed": outcomes["typed"],
              "accepted": outcomes["accepted"], "other_typed": outcomes["other-typed"],
              "internal": outcomes["internal"], "hang": outcomes["hang"],
              "per_input_limit_s": LIMIT_S, "slowest_input_s": round(slowest[0], 3),
              "slowest_input": slowest[1], "seed_file_bytes": len(data),
              "peak_rss_mb_after_seed_import": round(rss_after_seed, 1),
              "peak_rss_mb": round(peak_rss_mb(), 1), "first_failures": internal}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if not internal else 1


if __name__ == "__main__":
    sys.exit(main())
