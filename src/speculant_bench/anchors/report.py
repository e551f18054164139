"""The anchors' part of a bench report: their records, and speculant's ratios to them.

Every anchor runner is summarized with the figures speculant's runners get (decode and
end-to-end tokens/s, time to first token; medians with spread over the repeats, each repeat
pooling the prompt set), plus the decode and total time per prompt. Ratios are speculant ÷
anchor (above 1: speculant is faster), within the run:

- *per mode*: each anchor runner against the speculant runner that does the same job
  (greedy ↔ greedy, prompt lookup / n-gram ↔ ``prompt_lookup``, assisted / draft model ↔
  ``draft``, same k);
- *best*: speculant's fastest runner against each runtime's fastest runner (by median decode
  tokens/s, and separately by end-to-end tokens/s), among runners that decoded every token
  (speculant's must also match its greedy; an anchor's tokens may differ from speculant's
  greedy where float16 kernels break near-ties differently, which its row says).

Each ratio also has its spread over the repeats, runner against runner in the same repeat
(``decode_per_repeat``).
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant_bench.figures import decode_tokens_per_s, end_to_end_tokens_per_s, ttft_ms
from speculant_bench.run import BenchRun, RunnerResult, Sample
from speculant_bench.spread import Spread

RATIO_FIGURES = ("decode_tokens_per_s", "end_to_end_tokens_per_s")


def _figures():
    return {"decode_tokens_per_s": decode_tokens_per_s,
            "end_to_end_tokens_per_s": end_to_end_tokens_per_s,
            "time_to_first_token_ms": ttft_ms}


def decode_ms_per_prompt(samples: list[Sample]) -> float:
    return 1000 * sum(s.decode_s for s in samples) / len(samples)


def total_ms_per_prompt(samples: list[Sample]) -> float:
    return 1000 * sum(s.total_s for s in samples) / len(samples)


def _sum_counts(counts: list[dict], key: str):
    values = [c[key] for c in counts if key in c]
    return sum(values) if values and len(values) == len(counts) else None


def _genai_stats(counts: list[dict]) -> dict | None:
    stats = [c["genai_stats"] for c in counts if "genai_stats" in c]
    if not stats:
        return None
    return {key: sum(s.get(key, 0) for s in stats) for key in stats[0]}


def summarize_anchor(result: RunnerResult, greedy: RunnerResult | None,
                     new_tokens: Sequence[int]) -> dict:
    runner = result.runner
    figures = _figures()
    last = result.samples[-1]
    prompts = len(last)
    target_passes = _sum_counts(result.counts, "target_passes")
    stats = _genai_stats(result.counts)
    per_round = None
    if target_passes is not None and target_passes > prompts:  # HF: the prefill pass excluded
        per_round = sum(len(s.token_ids) - 1 for s in last) / (target_passes - prompts)
    elif stats and stats.get("rounds"):
        committed = sum(stats.get(key, 0) for key in ("draft_tokens_accepted",
                                                       "correction_tokens", "bonus_tokens"))
        per_round = committed / stats["rounds"]
    data = {
        "name": runner.name,
        "runtime": runner.runtime,
        "mode": runner.mode,
        "variant": runner.variant,
        "k": runner.k,
        "counterpart": runner.counterpart.name,
        "settings": runner.settings,
        **{name: result.per_repeat(figure).as_dict() for name, figure in figures.items()},
        "decode_ms_per_prompt": result.per_repeat(decode_ms_per_prompt).as_dict(),
        "total_ms_per_prompt": result.per_repeat(total_ms_per_prompt).as_dict(),
        "tokens_per_prompt": [len(s.token_ids) for s in last],
        "decoded_every_token": all(len(s.token_ids) == n for samples in result.samples
                                   for s, n in zip(samples, new_tokens, strict=True)),
        "matches_greedy": None,
        "prompts_equal_to_greedy": None,  # "m/n" in the last repeat
        "target_passes": target_passes,
        "draft_passes": _sum_counts(result.counts, "draft_passes"),
        "tokens_per_round": per_round,
        "genai_stats": stats,
    }
    if greedy is not None:
        reference = greedy.samples[-1]
        data["matches_greedy"] = not result.differences_from(greedy)
        equal = sum(s.token_ids == g.token_ids for s, g in zip(last, reference, strict=True))
        data["prompts_equal_to_greedy"] = f"{equal}/{len(last)}"
    return data


def _eligible(record: dict, anchor: bool = False) -> bool:
    """A runner that may stand for its runtime's best: it decoded every token, and (speculant's
    own runners) matched greedy."""
    return record["decoded_every_token"] and (anchor or record["matches_greedy"] is not False)


def _ratio(ours: RunnerResult, theirs: RunnerResult, figure_name: str) -> dict:
    figure = _figures()[figure_name]
    mine, other = ours.per_repeat(figure), theirs.per_repeat(figure)
    return {"ratio": mine.median / other.median,
            "per_repeat": Spread.of([a / b for a, b in zip(mine.values, other.values,
                                                           strict=True)]).as_dict()}


def ratios(results: list[RunnerResult], records: list[dict], anchors: list[RunnerResult],
           anchor_records: list[dict]) -> dict:
    """Per-mode and best-against-best ratios (speculant ÷ anchor) of one run."""
    by_runner = {r.runner: r for r in results}
    per_mode = []
    for anchor, record in zip(anchors, anchor_records, strict=True):
        ours = by_runner.get(anchor.runner.counterpart)
        row = {"anchor": record["name"], "speculant": anchor.runner.counterpart.name,
               "anchor_matches_greedy": record["matches_greedy"]}
        for figure in RATIO_FIGURES:
            row[figure] = _ratio(ours, anchor, figure) if ours is not None else None
        per_mode.append(row)

    best = []
    ours_ok = [(r, rec) for r, rec in zip(results, records, strict=True) if _eligible(rec)]
    for runtime in dict.fromkeys(a.runner.runtime for a in anchors):
        theirs_ok = [(a, rec) for a, rec in zip(anchors, anchor_records, strict=True)
                     if a.runner.runtime == runtime and _eligible(rec, anchor=True)]
        row = {"runtime": runtime}
        for figure in RATIO_FIGURES:
            if not ours_ok or not theirs_ok:
                row[figure] = None
                continue
            mine, mine_rec = max(ours_ok, key=lambda p: p[1][figure]["median"])
            other, other_rec = max(theirs_ok, key=lambda p: p[1][figure]["median"])
            row[figure] = {"speculant": mine_rec["name"], "anchor": other_rec["name"],
                           "anchor_matches_greedy": other_rec["matches_greedy"],
                           **_ratio(mine, other, figure)}
        best.append(row)
    return {"per_mode": per_mode, "best": best}


def annotate(report: dict, run: BenchRun) -> dict:
    """Add ``anchors`` to a bench report (nothing when none was asked for)."""
    setup = run.anchors
    if not run.config.anchors:
        return report
    greedy = next((r for r in run.results if not r.runner.is_speculative), None)
    records = [summarize_anchor(r, greedy, run.prompts.new_tokens) for r in run.anchor_results]
    report["anchors"] = {
        "requested": list(run.config.anchors),
        "runtimes": setup.info if setup is not None else {},
        "runners": records,
        "skipped": setup.skipped if setup is not None else [],
        "ratios": ratios(run.results, report["runners"], run.anchor_results, records),
    }
    return report


# -- Markdown -----------------------------------------------------------------------------
def _cell(spread: dict, digits: int = 0) -> str:
    return (f"{spread['median']:.{digits}f} "
            f"[{spread['min']:.{digits}f}–{spread['max']:.{digits}f}]")


def _times(ratio: dict | None) -> str:
    if ratio is None:
        return "–"
    spread = ratio["per_repeat"]
    return f"{ratio['ratio']:.2f}× [{spread['min']:.2f}–{spread['max']:.2f}]"


def _runtime_lines(runtimes: dict) -> list[str]:
    lines = []
    hf = runtimes.get("hf")
    if hf:
        versions = ", ".join(f"{k} {v}" for k, v in hf["versions"].items())
        lines.append(f"- hf: {versions}; {hf['dtype']} on {hf['device']}"
                     + (f", torch threads {hf['torch_threads']}" if hf["torch_threads"] else "")
                     + "; `generate(do_sample=False, min_new_tokens=N, max_new_tokens=N, "
                       "eos_token_id=None)` on the `export_hf` checkpoint")
    genai = runtimes.get("genai")
    if genai:
        versions = ", ".join(f"{k} {v}" for k, v in genai["versions"].items())
        patch = genai["config_patch"]
        built = (f"the model folder {genai['prebuilt']} (built beforehand)"
                 if genai.get("prebuilt") else
                 f"model builder `-p {genai['precision']}` on the same checkpoint")
        lines.append(f"- genai: {versions}; {built}; genai_config.json patched: "
                     f"intra_op_num_threads "
                     f"{patch['intra_op_num_threads']}, eos_token_id [], pad_token_id "
                     f"{patch['pad_token_id']} (never emitted by greedy); n-gram size "
                     f"{genai['ngram_size']}; LM-head check: {genai['lm_head_check']}")
    return lines


def markdown(report: dict) -> list[str]:
    section = report.get("anchors")
    if not section:
        return []
    lines = ["", "## Anchors: the same weights in other runtimes, in the same run", ""]
    lines += _runtime_lines(section["runtimes"])
    if section["runners"]:
        lines += [
            "",
            "| runner | pairs with | decode tok/s | end-to-end tok/s | TTFT ms | "
            "decode ms / prompt | target passes | tokens per round | = greedy | N tokens |",
            "|---|---|---:|---:|---:|---:|---:|---:|:---:|:---:|",
        ]
        for r in section["runners"]:
            same = "–" if r["matches_greedy"] is None else "yes" if r["matches_greedy"] else \
                f"NO ({r.get('prompts_equal_to_greedy') or '?'} prompts equal)"
            per_round = "–" if r["tokens_per_round"] is None else f"{r['tokens_per_round']:.2f}"
            passes = "–" if r["target_passes"] is None else str(r["target_passes"])
            lines.append(
                f"| {r['name']} | {r['counterpart']} | {_cell(r['decode_tokens_per_s'])} | "
                f"{_cell(r['end_to_end_tokens_per_s'])} | "
                f"{_cell(r['time_to_first_token_ms'], 2)} | "
                f"{_cell(r['decode_ms_per_prompt'], 2)} | {passes} | {per_round} | {same} | "
                f"{'yes' if r['decoded_every_token'] else 'NO'} |")
        ratios_ = section["ratios"]
        lines += [
            "", "### speculant ÷ anchor (same run; above 1: speculant faster; "
                "[min–max] of the repeat-by-repeat ratios)", "",
            "| pair | speculant | anchor | decode | end-to-end |",
            "|---|---|---|---:|---:|",
        ]
        for row in ratios_["best"]:
            decode, e2e = row["decode_tokens_per_s"], row["end_to_end_tokens_per_s"]
            if decode is None:
                lines.append(f"| best vs {row['runtime']} best | – | – | – | – |")
                continue
            e2e_note = "" if e2e["speculant"] == decode["speculant"] and \
                e2e["anchor"] == decode["anchor"] else \
                f" ({e2e['speculant']} ÷ {e2e['anchor']})"
            differs = "" if decode.get("anchor_matches_greedy") is not False else \
                " (its tokens differ from greedy)"
            lines.append(f"| best vs {row['runtime']} best | {decode['speculant']} | "
                         f"{decode['anchor']}{differs} | {_times(decode)} | "
                         f"{_times(e2e)}{e2e_note} |")
        for row in ratios_["per_mode"]:
            lines.append(f"| same mode | {row['speculant']} | {row['anchor']} | "
                         f"{_times(row['decode_tokens_per_s'])} | "
                         f"{_times(row['end_to_end_tokens_per_s'])} |")
    if section["skipped"]:
        lines += ["", "Anchors skipped:", ""]
        for entry in section["skipped"]:
            lines.append(f"- {entry['name']}: {entry['reason']}")
    genai_rows = [r for r in section["runners"] if r["genai_stats"]]
    if genai_rows:
        lines += ["", "onnxruntime-genai's own counters (summed over the prompt set, from "
                      "`get_speculative_stats`):", ""]
        for r in genai_rows:
            stats = ", ".join(f"{k} {v}" for k, v in r["genai_stats"].items())
            lines.append(f"- {r['name']}: {stats}")
    return lines


# -- plot ---------------------------------------------------------------------------------
def plot_on(ax, report: dict) -> None:
    """Anchor lines on the tokens/s-vs-k axes: dotted, one per runtime and mode; greedy
    anchors as dotted horizontal lines."""
    section = report.get("anchors")
    if not section:
        return
    rows = section["runners"]
    for row in rows:
        if row["mode"] == "greedy":
            ax.axhline(row["decode_tokens_per_s"]["median"], linestyle=":", linewidth=1.2,
                       color="tab:gray" if row["runtime"] == "hf" else "tab:cyan",
                       label=row["name"])
    def key_of(row: dict) -> tuple[str, ...]:
        return (row["runtime"], row["mode"]) + ((row["variant"],) if row.get("variant") else ())

    fixed = [r for r in rows if isinstance(r["k"], int) and r["k"]]  # k = auto has no x
    for key in dict.fromkeys(key_of(r) for r in fixed):
        line = sorted((r for r in fixed if key_of(r) == key), key=lambda r: r["k"])
        ax.plot([r["k"] for r in line], [r["decode_tokens_per_s"]["median"] for r in line],
                linestyle=":", marker="x", label=" ".join(key))
