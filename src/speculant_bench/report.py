"""A bench run as ``bench.json`` (everything), ``bench.md`` (the table) and PNG plots.

Every timed figure is a `Spread` over the repeats; each repeat's figure pools the whole prompt
set (tokens over seconds, summed over prompts). Counts and acceptance are exact (greedy
decoding is deterministic) and come from the last repeat.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from speculant_bench import limits
from speculant_bench.anchors import report as anchor_report
from speculant_bench.figures import decode_tokens_per_s, end_to_end_tokens_per_s, ttft_ms
from speculant_bench.run import BenchRun, RunnerResult, Sample
from speculant_bench.runners import Runner
from speculant_bench.spec_bench import report as spec_bench_report
from speculant_bench.spread import Spread

SCHEMA = "speculant_bench/1"
PNG_FILES = ("tokens_per_s_vs_k.png", "acceptance_by_position.png")


# -- figures per repeat (one list of samples = one pass over the prompt set) ----------------
def round_ms(part: str):
    """Milliseconds per round (per target pass after the prefill) spent in ``part``."""
    def figure(samples: list[Sample]) -> float:
        passes = sum(s.num_passes for s in samples)
        proposer = sum(s.proposer_s for s in samples)
        target = sum(s.target_s for s in samples)
        total = sum(s.decode_s for s in samples)
        seconds = {"proposer": proposer, "target": target, "other": total - proposer - target,
                   "total": total}[part]
        return 1000 * seconds / passes
    return figure


# -- the report -------------------------------------------------------------------------------
def summarize_runner(result: RunnerResult, greedy: RunnerResult | None,
                     new_tokens: Sequence[int]) -> dict:
    stats = result.stats
    rounds = sum(s.rounds for s in stats)
    accepted_lengths = sum(a for s in stats for _, a in s.trace)
    width = max((len(s.proposed_at) for s in stats), default=0)
    proposed = [sum(s.proposed_at[i] for s in stats if i < len(s.proposed_at))
                for i in range(width)]
    accepted = [sum(s.accepted_at[i] for s in stats if i < len(s.accepted_at))
                for i in range(width)]
    decode = result.per_repeat(decode_tokens_per_s)
    end_to_end = result.per_repeat(end_to_end_tokens_per_s)
    last = result.samples[-1]
    data = {
        "name": result.runner.name,
        "proposer": result.runner.proposer,
        "k": result.runner.k,
        "decode_tokens_per_s": decode.as_dict(),
        "end_to_end_tokens_per_s": end_to_end.as_dict(),
        "time_to_first_token_ms": result.per_repeat(ttft_ms).as_dict(),
        "round_ms": {part: result.per_repeat(round_ms(part)).as_dict()
                     for part in ("proposer", "target", "other", "total")},
        "tokens_per_prompt": [len(s.token_ids) for s in last],
        "decoded_every_token": all(len(s.token_ids) == n for samples in result.samples
                                   for s, n in zip(samples, new_tokens, strict=True)),
        "target_passes": sum(s.target_passes for s in stats),
        "rounds": rounds,
        "greedy_steps": sum(s.greedy_steps for s in stats),
        "proposer_invocations": sum(s.proposer_invocations for s in stats),
        "drafts_proposed": sum(s.drafts_proposed for s in stats),
        "accepted_drafts": sum(s.accepted_drafts for s in stats),
        "mean_accepted_length": accepted_lengths / rounds if rounds else None,
        "acceptance_by_position": [a / p for a, p in zip(accepted, proposed, strict=True)],
        "matches_greedy": None,
        "prompts_differing_from_greedy": None,
        "speedup_decode": 1.0 if greedy is result else None,
        "speedup_end_to_end": 1.0 if greedy is result else None,
        "speedup_decode_per_repeat": None,  # paired ratios, for their spread
    }
    if greedy is not None and greedy is not result:
        differences = result.differences_from(greedy)
        data["matches_greedy"] = not differences
        data["prompts_differing_from_greedy"] = {  # prompt index: first token that differs
            str(index): at for index, at in differences.items()}
        data["speedup_decode"] = decode.median / \
            greedy.per_repeat(decode_tokens_per_s).median
        data["speedup_end_to_end"] = end_to_end.median / \
            greedy.per_repeat(end_to_end_tokens_per_s).median
        data["speedup_decode_per_repeat"] = Spread.of(
            [v / g for v, g in zip(decode.values, greedy.per_repeat(decode_tokens_per_s).values,
                                   strict=True)]).as_dict()
    return data


def summarize(run: BenchRun, command: str) -> dict:
    config, engine = run.config, run.engine
    greedy = next((r for r in run.results if not r.runner.is_speculative), None)
    runners = [summarize_runner(r, greedy, run.prompts.new_tokens) for r in run.results]
    base = Spread.of(run.widths[0].pass_s).median
    spec = engine.package.document.speculative
    report = limits.annotate({
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine() | {"load_average": {"start": list(run.load_average),
                                                  "end": list(os.getloadavg())}},
        "versions": versions(),
        "package": {"path": _shown(Path(config.package)), "target": engine.package.plan.target,
                    "proposer": engine.package.plan.proposer,
                    "draft": _shown(Path(config.draft)) if config.draft else None,
                    "max_proposal_width": spec.max_proposal_width if spec else None},
        "config": {"device": config.device, "threads": run.threads,
                   "cpu_pool": run.engine.cpu_pool,
                   "new_tokens": config.new_tokens, "warmup": config.warmup,
                   "repeats": config.repeats, "proposers": list(config.proposers),
                   "k": list(config.ks)},
        "prompts": {"source": run.prompts.source, "count": len(run.prompts.prompts),
                    "lengths": run.prompts.lengths, "truncated": run.prompts.num_truncated,
                    "new_tokens": list(run.prompts.new_tokens)},
        "runners": runners,
        "skipped": [{"name": r.name, "proposer": r.proposer, "k": r.k, "reason": reason}
                    for r, reason in run.skipped],
        "verify_width": {
            "cache_length": run.width_cache_length,
            "repeats": config.width_repeats,
            "widths": [{"width": w.width,
                        "pass_ms": Spread.of(w.pass_s).scaled(1000).as_dict(),
                        "invoke_ms": Spread.of(w.invoke_s).scaled(1000).as_dict(),
                        "bare_run_ms": Spread.of(w.bare_s).scaled(1000).as_dict(),
                        "ratio": Spread.of(w.pass_s).median / base}
                       for w in run.widths],
        },
    }, run.limit)
    if greedy is not None and run.widths[0].width == 1:
        bare_ms = Spread.of(run.widths[0].bare_s).median * 1000
        per_token = 1000 / greedy.per_repeat(decode_tokens_per_s).median
        report["runtime_overhead"] = {"greedy_ms_per_token": per_token, "bare_run_ms": bare_ms,
                                      "share": 1 - bare_ms / per_token}
    if run.compared:
        report["compared"] = summarize_compared(run)
    return spec_bench_report.annotate(anchor_report.annotate(report, run), run)


def summarize_compared(run: BenchRun) -> list[dict]:
    """Each compared package: its runners' records (× its own greedy), each runner's decode
    tokens/s over the package's same runner (median over median, and per repeat), and whether
    it decoded the package's greedy tokens (a compared target quantized differently may not)."""
    ours = {result.runner: result for result in run.results}
    our_greedy = ours.get(Runner())
    packages = []
    for package in run.compared:
        results = [r for r in run.compared_results if r.runner.label == package.label]
        greedy = next((r for r in results if not r.runner.is_speculative), None)
        records = []
        for result in results:
            record = summarize_runner(result, greedy, run.prompts.new_tokens)
            same = ours.get(result.runner.runner)
            record["over_package_decode"] = None
            record["over_package_decode_per_repeat"] = None
            record["matches_package_greedy"] = None if our_greedy is None else \
                not result.differences_from(our_greedy)
            if same is not None:
                mine = result.per_repeat(decode_tokens_per_s)
                theirs = same.per_repeat(decode_tokens_per_s)
                record["over_package_decode"] = mine.median / theirs.median
                record["over_package_decode_per_repeat"] = Spread.of(
                    [a / b for a, b in zip(mine.values, theirs.values, strict=True)]).as_dict()
            records.append(record)
        packages.append({
            "label": package.label, "path": package.path,
            "target": package.engine.package.plan.target,
            "proposer": package.engine.package.plan.proposer, "runners": records,
            "skipped": [{"name": r.name, "proposer": r.proposer, "k": r.k, "reason": reason}
                        for r, reason in package.skipped]})
    return packages


def _shown(path: Path) -> str:
    """Relative to the working directory when inside it (reports stay readable elsewhere)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": _cores(), "gpu": _gpu_name(),
            "platform": platform.platform(), "hostname": platform.node()}


def _cores() -> dict:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"logical": os.cpu_count(), "usable": usable}


def _gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names) or None


def versions() -> dict:
    """Installed distributions, the ONNX Runtime actually imported (both flavours can be
    installed; one wins), and the source: commit and files changed under src/ if a checkout."""
    import onnxruntime

    found = {"python": sys.version.split()[0]}
    for name in ("speculant", "onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "cupy-cuda13x",
                 "matplotlib", "torch", "transformers", "onnxruntime-genai",
                 "onnxruntime-genai-cuda"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    found["onnxruntime_imported"] = (f"{onnxruntime.__version__} "
                                     f"({', '.join(onnxruntime.get_available_providers())})")
    found["source"] = _source()
    return found


def _source() -> dict | None:
    root = Path(__file__).resolve().parents[2]  # src/speculant_bench/report.py -> checkout
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                  "src"], check=True, capture_output=True, text=True,
                                 timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "changed_in_src": [line[3:] for line in changed]}


# -- Markdown -----------------------------------------------------------------------------
def _spread_cell(spread: dict, digits: int = 0) -> str:
    return (f"{spread['median']:.{digits}f} "
            f"[{spread['min']:.{digits}f}–{spread['max']:.{digits}f}]")


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def markdown(report: dict) -> str:
    m, c, p = report["machine"], report["config"], report["prompts"]
    source = report["versions"].get("source")
    versions_line = ", ".join(f"{k} {v}" for k, v in report["versions"].items()
                              if k not in ("source", "onnxruntime_imported"))
    versions_line += f"; imported onnxruntime {report['versions']['onnxruntime_imported']}"
    if source:
        versions_line += f"; commit {source['commit'][:12]}" + (
            f" with changes in {', '.join(source['changed_in_src'])}"
            if source["changed_in_src"] else "")
    lines = [
        f"# speculant bench: {Path(report['package']['path']).name}",
        "",
        f"- date: {report['date']}",
        f"- machine: {m['cpu']} ({m['cores']['usable']} usable of {m['cores']['logical']} "
        f"logical CPUs), GPU: {m['gpu'] or 'none'}; load average (1 min) "
        f"{m['load_average']['start'][0]:.2f} at the start, {m['load_average']['end'][0]:.2f} "
        "at the end",
        f"- device: {c['device']}, ONNX Runtime intra-op threads: {c['threads'] or 'default'}"
        + (f"; CPU thread pool: {c['cpu_pool']}" if c.get("cpu_pool") else ""),
        f"- prompts: {p['count']} from {p['source']}, {min(p['lengths'])}–{max(p['lengths'])} "
        f"tokens ({p['truncated']} truncated to fit); " + (
            f"{c['new_tokens']} new tokens each" if "spec_bench" not in report else
            f"greedy's answer to each, {min(p['new_tokens'])}–{max(p['new_tokens'])} new "
            "tokens") + ", EOS masked",
        f"- warm-up {c['warmup']}, repeats {c['repeats']}: median [min–max] over repeats",
        f"- versions: {versions_line}",
        f"- command: `{report['command']}`",
        "",
        *spec_bench_report.markdown(report),
        "| runner | decode tok/s | × greedy | end-to-end tok/s | × greedy | TTFT ms | "
        "target passes | mean accepted length | acceptance by position | "
        "ms/round proposer / target / other | = greedy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|:---:|",
    ]
    for r in report["runners"]:
        split = " / ".join(f"{r['round_ms'][part]['median']:.3f}"
                           for part in ("proposer", "target", "other"))
        acceptance = " ".join(f"{a:.2f}" for a in r["acceptance_by_position"])
        if r["proposer"] is not None and not r["rounds"]:
            acceptance = "no speculative round ran"
        mean = r["mean_accepted_length"]
        same = "–" if r["matches_greedy"] is None else "yes" if r["matches_greedy"] else \
            f"NO ({len(r['prompts_differing_from_greedy'])} of {len(r['tokens_per_prompt'])} " \
            "prompts)"
        lines.append(
            f"| {r['name']} | {_spread_cell(r['decode_tokens_per_s'])} | "
            f"{_ratio(r['speedup_decode'])} | {_spread_cell(r['end_to_end_tokens_per_s'])} | "
            f"{_ratio(r['speedup_end_to_end'])} | "
            f"{_spread_cell(r['time_to_first_token_ms'], 2)} | {r['target_passes']} | "
            f"{'–' if mean is None else f'{mean:.2f}'} | {acceptance or '–'} | {split} | "
            f"{same} |")
    if report["skipped"]:
        lines += ["", "Skipped:", ""]
        for reason, names in _group_skipped(report["skipped"]).items():
            lines.append(f"- {', '.join(names)}: {reason}")
    w = report["verify_width"]
    lines += [
        "", f"## Verify-width cost curve (target, cache length {w['cache_length']}, "
        f"{w['repeats']} repeats)", "",
        "| block size k+1 | pass ms | of which invoke ms | bare ORT run ms | runtime's share "
        "| t(k+1)/t(1) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in w["widths"]:
        share = 1 - row["bare_run_ms"]["median"] / row["pass_ms"]["median"]
        lines.append(f"| {row['width']} | {_spread_cell(row['pass_ms'], 3)} | "
                     f"{_spread_cell(row['invoke_ms'], 3)} | "
                     f"{_spread_cell(row['bare_run_ms'], 3)} | {share:.0%} | "
                     f"{row['ratio']:.2f} |")
    overhead = report.get("runtime_overhead")
    if overhead:
        lines += ["", f"Runtime overhead per greedy pass: greedy decodes a token in "
                  f"{overhead['greedy_ms_per_token']:.3f} ms; ONNX Runtime's bare run of "
                  f"the same 1-token pass takes {overhead['bare_run_ms']:.3f} ms; the "
                  f"runtime's share is {overhead['share']:.1%} (everything the runtime does "
                  "per token that does not overlap the device: binding, checks, the round, "
                  "argmax and read-back)."]
    lines += compared_markdown(report)
    lines += limits.markdown(report)
    lines += anchor_report.markdown(report)
    return "\n".join(lines) + "\n"


def compared_markdown(report: dict) -> list[str]:
    """The compared packages' table (no lines when none was compared)."""
    if not report.get("compared"):
        return []
    lines = ["", "## Compared packages (same run, same prompts, interleaved)", "",
             f"The package: `{report['package']['path']}`. Each runner's decode tok/s, × its "
             "own package's greedy, and × the package's same runner (median over median; "
             "per repeat [min–max]).", "",
             "| package | runner | decode tok/s | × its greedy | × the package's | "
             "mean accepted length | = its greedy | = the package's greedy |",
             "|---|---|---:|---:|---:|---:|:---:|:---:|"]
    for package in report["compared"]:
        for r in package["runners"]:
            over = r["over_package_decode"]
            spread = r["over_package_decode_per_repeat"]
            mean = r["mean_accepted_length"]
            same, ours = (("–" if value is None else "yes" if value else "NO")
                          for value in (r["matches_greedy"], r["matches_package_greedy"]))
            lines.append(
                f"| {package['label']} (`{package['path']}`) | {r['name']} | "
                f"{_spread_cell(r['decode_tokens_per_s'])} | {_ratio(r['speedup_decode'])} | "
                + ("–" if over is None else
                   f"{over:.2f}× [{spread['min']:.2f}–{spread['max']:.2f}]")
                + f" | {'–' if mean is None else f'{mean:.2f}'} | {same} | {ours} |")
    for package in report["compared"]:
        for reason, names in _group_skipped(package["skipped"]).items():
            lines += ["", f"{package['label']} skipped {', '.join(names)}: {reason}"]
    return lines


def _group_skipped(skipped: list[dict]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for entry in skipped:
        grouped.setdefault(entry["reason"], []).append(entry["name"])
    return grouped


# -- plots --------------------------------------------------------------------------------
def plot(report: dict, out: Path) -> list[Path]:
    """Write the PNGs; raises ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    title = (f"{Path(report['package']['path']).name} on {report['config']['device']} "
             f"({report['machine']['gpu'] or report['machine']['cpu']})")
    runners = report["runners"]
    speculative = [r for r in runners if r["proposer"] is not None]
    greedy = next((r for r in runners if r["proposer"] is None), None)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if greedy is not None:
        g = greedy["decode_tokens_per_s"]
        ax.axhline(g["median"], color="black", linestyle="--", label="greedy")
        ax.axhspan(g["min"], g["max"], color="black", alpha=0.1)
    fixed = [r for r in speculative if isinstance(r["k"], int)]  # k = auto has no x
    for proposer in dict.fromkeys(r["proposer"] for r in fixed):
        rows = sorted((r for r in fixed if r["proposer"] == proposer), key=lambda r: r["k"])
        ks = [r["k"] for r in rows]
        medians = [r["decode_tokens_per_s"]["median"] for r in rows]
        below = [m - r["decode_tokens_per_s"]["min"] for m, r in zip(medians, rows, strict=True)]
        above = [r["decode_tokens_per_s"]["max"] - m for m, r in zip(medians, rows, strict=True)]
        ax.errorbar(ks, medians, yerr=[below, above], marker="o", capsize=3, label=proposer)
    anchor_report.plot_on(ax, report)
    ax.set_xscale("log", base=2)
    ticks = [k for k in report["config"]["k"] if isinstance(k, int)]
    if ticks:
        ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.set_xlabel("k (drafts per round)")
    ax.set_ylabel("decode tokens/s (median, min–max)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7 if report.get("anchors") else None)
    fig.tight_layout()
    paths = [out / PNG_FILES[0]]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    with_rounds = [r for r in speculative if r["rounds"]]
    proposers = list(dict.fromkeys(r["proposer"] for r in with_rounds)) or [None]
    fig, axes = plt.subplots(1, len(proposers), figsize=(4 + 3 * len(proposers), 4.5),
                             squeeze=False, sharey=True)
    for ax, proposer in zip(axes[0], proposers, strict=True):
        for r in (r for r in with_rounds if r["proposer"] == proposer):
            rates = r["acceptance_by_position"]
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"k={r['k']}")
        if proposer is None:
            ax.text(0.5, 0.5, "no speculative round ran", ha="center", transform=ax.transAxes)
        else:
            ax.set_title(proposer, fontsize=9)
            ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("draft position in the block")
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel("fraction of drafts accepted")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    paths.append(out / PNG_FILES[1])
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths
