"""Constrained output with and without speculation: acceptance and speed on one engine.

For each prompt and each runner (plain, prompt lookup, chained, the draft model with ``--draft``;
each without and with a JSON
schema), decode greedily to the end of the schema's object (or the token budget), repeated and
interleaved runner by runner so the machine's load touches every runner alike. Reports tokens,
the mean accepted length, the first draft's acceptance, the median decode rate (admission to
last token, load excluded) and whether every constrained run equals the plain constrained one
and validates against the schema. Writes a Markdown table to stdout and JSON to ``--out``.

    uv run --extra cpu python scripts/bench_structured.py [PACKAGE] [--draft DRAFT] \
        [--repeats 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import speculant
from speculant import GenerationOptions, Grammar

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16},
                   "version": {"type": "string", "maxLength": 8},
                   "license": {"enum": ["MIT", "Apache-2.0", "BSD-3-Clause", "GPL-3.0"]},
                   "dependencies": {"type": "array", "items": {"type": "string",
                                                               "maxLength": 16},
                                    "maxItems": 4},
                   "is_private": {"type": "boolean"}},
    "required": ["name", "version", "license", "dependencies", "is_private"],
    "additionalProperties": False,
}
PROMPTS = ['config = {"name": "speculant", "version": "0.1.0", "license": "Apache-2.0", '
           '"dependencies": ["numpy", "onnx"], "is_private": false}\npackage = ',
           "def package_info():\n    return ",
           '# package.json\n']
RUNNERS = [("plain", None, None), ("prompt_lookup k=4", "prompt_lookup", 4),
           ("chained k=4", "chained", 4), ("chained k=auto", "chained", "auto")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="demo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--draft", default=None, help="a draft-model package: adds its runner")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    engine = speculant.load(args.package, draft=args.draft)
    runners = RUNNERS + ([("draft k=3", "draft", 3)] if args.draft else [])
    grammar = Grammar.json_schema(SCHEMA)
    rows: dict[tuple[str, bool], dict] = {}
    reference: dict[int, list[int]] = {}
    for constrained in (False, True):
        for name, _, _ in runners:
            rows[name, constrained] = {"rates": [], "tokens": 0, "accepted": 0, "rounds": 0,
                                       "first": 0, "is_exact": True, "is_valid": True}
    for prompt_index, prompt in enumerate(PROMPTS):
        for constrained in (False, True):
            for _ in range(args.repeats):  # interleaved: every runner once per repeat
                for name, proposer, k in runners:
                    options = GenerationOptions(
                        max_new_tokens=args.new_tokens, proposer=proposer,
                        k=k if proposer else "auto", grammar=grammar if constrained else None)
                    started = time.perf_counter()
                    result = engine.generate(prompt, options)
                    elapsed = time.perf_counter() - started
                    row, stats = rows[name, constrained], result.stats
                    row["rates"].append(len(result.token_ids) / elapsed)
                    row["tokens"] += len(result.token_ids)
                    row["accepted"] += stats.accepted_drafts
                    row["rounds"] += stats.rounds
                    row["first"] += stats.rounds_with_first_draft_accepted
                    if constrained:
                        key = prompt_index
                        reference.setdefault(key, result.token_ids)
                        row["is_exact"] &= result.token_ids == reference[key]
                        row["is_valid"] &= _is_valid(result.text)
    print(f"`{args.package}`, {len(PROMPTS)} prompts x {args.repeats} repeats, greedy, up to "
          f"{args.new_tokens} tokens; load average {os.getloadavg()[0]:.1f}\n")
    print("| runner | schema | tokens/run | mean accepted length | first draft accepted | "
          "tok/s (median) | vs plain | = plain constrained, valid |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for (name, constrained), row in rows.items():
        runs = len(PROMPTS) * args.repeats
        rate = statistics.median(row["rates"])
        plain = statistics.median(rows["plain", constrained]["rates"])
        mean = 1 + row["accepted"] / row["rounds"] if row["rounds"] else None
        first = row["first"] / row["rounds"] if row["rounds"] else None
        check = (("yes" if row["is_exact"] else "NO") + ", " +
                 ("yes" if row["is_valid"] else "NO")) if constrained else "—"
        print(f"| {name} | {'yes' if constrained else 'no'} | {row['tokens'] / runs:.0f} | "
              f"{'—' if mean is None else f'{mean:.2f}'} | "
              f"{'—' if first is None else f'{first:.0%}'} | {rate:.0f} | "
              f"{rate / plain:.2f}x | {check} |")
        summary[f"{name}{' +schema' if constrained else ''}"] = {
            "tokens_per_run": row["tokens"] / runs, "mean_accepted_length": mean,
            "first_draft_accepted": first, "median_tokens_per_s": rate,
            "vs_plain": rate / plain, "equals_plain": row["is_exact"],
            "valid": row["is_valid"]}
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"package": args.package, "repeats": args.repeats,
                       "load_average": os.getloadavg()[0], "runners": summary}, out, indent=1)


def _is_valid(text: str) -> bool:
    try:
        import jsonschema

        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


if __name__ == "__main__":
    main()
