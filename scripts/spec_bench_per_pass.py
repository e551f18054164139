"""Tokens per target pass, per Spec-Bench category, from ``speculant bench --spec-bench``'s
``bench.json`` (the figure that counts a proposer's no-draft greedy steps, which the bench's
mean accepted length, a per-round figure, leaves out):

    python scripts/spec_bench_per_pass.py OUT/bench.json [OTHER/bench.json]

Per category and runner: decode tokens (each question's first token excluded) over decode
target passes (rounds, plus one greedy step for every decode token no round committed),
with the decode tok/s × greedy beside it; ``OTHER``'s ``lookup_chained k=4`` as a last column.
"""

from __future__ import annotations

import json
import sys

CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag",
              "overall")
RUNNERS = ("chained k=4", "prompt_lookup k=4", "lookup_chained k=4", "lookup_chained k=auto")


def per_pass(path: str) -> dict[tuple[str, str], tuple[float, float]]:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)["spec_bench"]["rows"]
    table = {}
    for row in rows:
        if row["proposer"] is None:
            continue
        decoded = row["tokens"] - row["questions"]
        in_rounds = row["rounds"] * (row["mean_accepted_length"] or 0)
        passes = row["rounds"] + decoded - in_rounds
        table[row["category"], f"{row['proposer']} k={row['k']}"] = (
            decoded / passes, row["speedup_decode"])
    return table


def main() -> None:
    table = per_pass(sys.argv[1])
    other = per_pass(sys.argv[2]) if len(sys.argv) > 2 else {}
    extra = " | lookup_chained k=4, fixed rule |" if other else " |"
    print("| category | " + " | ".join(RUNNERS) + extra)
    print("|---|" + "---:|" * (len(RUNNERS) + bool(other)))
    for category in CATEGORIES:
        cells = [f"{table[category, r][0]:.2f} ({table[category, r][1]:.2f}×)" for r in RUNNERS]
        if other:
            tokens, speedup = other[category, "lookup_chained k=4"]
            cells.append(f"{tokens:.2f} ({speedup:.2f}×)")
        print(f"| {category} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
