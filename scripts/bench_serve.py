"""A bounded load test of `speculant serve`: N concurrent clients x M requests each.

    python scripts/bench_serve.py [PACKAGE] --clients 4 --requests 8 --max-tokens 64 \
        --config plain --config chained:2 --config prompt_lookup --out DIR
    python scripts/bench_serve.py --url http://host:8000 --model demo ...   # a running server

Without ``--url`` it starts ``speculant serve PACKAGE`` on a free local port (a subprocess,
so the clients do not share its interpreter) and stops it at the end. Each config is one
pass: every client sends its M requests one after another, streaming (``stream=true`` with
``include_usage``), with the config's speculative extension fields (``plain``: proposer
null; ``chained:4``, ``draft``, ``prompt_lookup:3``: that proposer, K drafts per round or its
default). Prompts are
the package's ``val_prompts.json`` (token ids) when it has one, else ``--prompt``.

Reported per config: requests/s and generated tokens/s over the pass's wall time, p50 and
p99 time to first token (first text piece) and request latency, as the client sees them,
and the server's speculative counters (/metrics) over the pass; with a started server, the
same requests through ``engine.generate`` in this process, one at a time, as a baseline
without HTTP. Writes ``results.json`` and
``results.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

SPEC_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total")


def main() -> None:
    args = _parse()
    server = None
    url = args.url
    load_before = os.getloadavg()
    if url is None:
        server, url = _start_server(args.package, args.threads)
    try:
        _wait_healthy(url)
        model = args.model or _served_model(url)
        prompts = _prompts(args)
        passes: dict[str, list] = {config: [] for config in args.config}
        for _ in range(args.rounds):  # configs interleaved, so load drifts hit them alike
            for config in args.config:
                passes[config].append(asyncio.run(_run_pass(url, model, config, prompts,
                                                            args)))
        results = [_summary(config, config_passes) for config, config_passes in passes.items()]
        if args.url is None:
            _add_engine_alone(results, prompts, args)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    report = {"command": " ".join(["python", *sys.argv]), "machine": _machine(),
              "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
              "package": args.package, "clients": args.clients,
              "requests_per_client": args.requests, "rounds": args.rounds,
              "max_tokens": args.max_tokens,
              "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "results.md").write_text(_markdown(report))
    print(_markdown(report))


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default="demo")
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--model", help="model id (default: the server's only model)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8, help="requests per client")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes per config, the configs taking turns")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--config", action="append", type=_config,
                        help="plain, or PROPOSER[:K] (chained, draft, prompt_lookup); "
                             "repeatable (default: plain and chained)")
    parser.add_argument("--prompt", default="def fib(n):")
    parser.add_argument("--threads", type=int, default=None,
                        help="ONNX Runtime intra-op threads of the started server's sessions "
                             "(and of the engine-alone baseline)")
    parser.add_argument("--out", default="bench-serve")
    args = parser.parse_args()
    args.config = args.config or ["plain", "chained"]
    return args


def _config(text: str) -> str:
    proposer, _, k = text.partition(":")
    if proposer not in ("plain", "chained", "draft", "prompt_lookup") or \
            (k and (not k.isdigit() or proposer == "plain")):
        raise argparse.ArgumentTypeError(f"{text!r}: plain, or PROPOSER[:K]")
    return text


def _start_server(package: str, threads: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads_args = ["--threads", str(threads)] if threads is not None else []
    server = subprocess.Popen([sys.executable, "-m", "speculant", "serve", package,
                               "--port", str(port), "--log-level", "warning", *threads_args])
    return server, f"http://127.0.0.1:{port}"


def _wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _served_model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models") as response:
        return json.loads(response.read())["data"][0]["id"]


def _prompts(args: argparse.Namespace) -> list:
    from speculant.package.builtin import resolve_package

    folder = resolve_package(args.package)
    path = folder / "val_prompts.json"
    if path.exists():
        return [p["prompt"] for p in json.loads(path.read_text())["prompts"]]
    return [args.prompt]


def _spec_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics") as response:
        text = response.read().decode()
    totals = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for name in SPEC_COUNTERS:
        for value in re.findall(rf"^speculant:{name}\{{[^}}]*\}} (\S+)$", text, re.M):
            totals[name] += float(value)
    return totals


async def _run_pass(url: str, model: str, config: str, prompts: list,
                    args: argparse.Namespace) -> tuple[list[dict], float, dict[str, float]]:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                                timeout=600)
    proposer, _, k = config.partition(":")
    extra = {"proposer": None} if proposer == "plain" else \
        {"proposer": proposer, "k": int(k) if k else None}

    async def one(prompt) -> dict:
        started = time.perf_counter()
        first_at, num_tokens = None, 0
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=args.max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first_at is None:
                first_at = time.perf_counter()
            if chunk.usage is not None:
                num_tokens = chunk.usage.completion_tokens
        ended = time.perf_counter()
        return {"ttft_s": (first_at or ended) - started, "latency_s": ended - started,
                "num_tokens": num_tokens}

    async def client_loop(c: int) -> list[dict]:
        return [await one(prompts[(c * args.requests + r) % len(prompts)])
                for r in range(args.requests)]

    await one(prompts[0])  # warm-up, not counted
    before = _spec_counters(url)
    started = time.perf_counter()
    per_client = await asyncio.gather(*(client_loop(c) for c in range(args.clients)))
    wall = time.perf_counter() - started
    after = _spec_counters(url)
    await client.close()
    done = [r for rs in per_client for r in rs]
    spec = {name.removesuffix("_total"): after[name] - before[name] for name in SPEC_COUNTERS}
    return done, wall, spec


def _summary(config: str, passes: list[tuple[list[dict], float, dict[str, float]]]) -> dict:
    """One config over its passes: rates over the summed wall time, percentiles over every
    request, and each pass's tokens/s (their spread shows the machine's drift)."""
    done = [r for records, _, _ in passes for r in records]
    wall = sum(w for _, w, _ in passes)
    ttft = np.array([r["ttft_s"] for r in done])
    latency = np.array([r["latency_s"] for r in done])
    num_tokens = sum(r["num_tokens"] for r in done)
    spec = {name: sum(p[2][name] for p in passes) for name in passes[0][2]}
    drafts = spec["spec_decode_num_draft_tokens"]
    return {"config": config, "num_requests": len(done), "wall_s": wall,
            "requests_per_s": len(done) / wall, "tokens_per_s": num_tokens / wall,
            "tokens_per_s_per_pass": [sum(r["num_tokens"] for r in records) / w
                                      for records, w, _ in passes],
            "num_generated_tokens": num_tokens,
            "ttft_p50_ms": 1000 * float(np.percentile(ttft, 50)),
            "ttft_p99_ms": 1000 * float(np.percentile(ttft, 99)),
            "latency_p50_ms": 1000 * float(np.percentile(latency, 50)),
            "latency_p99_ms": 1000 * float(np.percentile(latency, 99)),
            **spec, "acceptance_rate": spec["spec_decode_num_accepted_tokens"] / drafts
            if drafts else None}


def _add_engine_alone(results: list[dict], prompts: list, args: argparse.Namespace) -> None:
    """The same requests through ``engine.generate`` in this process, one after another (no
    HTTP, no concurrency): tokens per second of decode time, beside each config."""
    from speculant import GenerationOptions
    from speculant.serve import load_engine

    engine = load_engine(args.package, threads=args.threads)
    num_requests = args.clients * args.requests
    for result in results:  # the same prompts as the passes: client c's r-th request
        proposer, _, k = result["config"].partition(":")
        options = GenerationOptions(max_new_tokens=args.max_tokens,
                                    proposer=None if proposer == "plain" else proposer,
                                    k=int(k) if k else None)
        engine.generate(prompts[0], options)  # warm-up
        runs = [engine.generate(prompts[i % len(prompts)], options)
                for i in range(num_requests * args.rounds)]
        result["engine_alone_tokens_per_s"] = (sum(len(r.token_ids) for r in runs)
                                               / sum(r.total_s for r in runs))


def _machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"


def _markdown(report: dict) -> str:
    lines = [f"`{report['command']}`", "",
             f"{report['rounds']} rounds x {report['clients']} clients x "
             f"{report['requests_per_client']} requests, "
             f"max_tokens {report['max_tokens']}, package {report['package']}; "
             f"{report['machine']}; 1-minute load average "
             f"{report['load_average_1min']['before']:.1f} before, "
             f"{report['load_average_1min']['after']:.1f} after", "",
             "| config | req/s | tok/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms | "
             "latency p99 ms | drafts | draft tokens | accepted | acceptance | "
             "engine alone tok/s | tok/s per pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        rate = f"{r['acceptance_rate']:.2f}" if r["acceptance_rate"] is not None else "-"
        alone = r.get("engine_alone_tokens_per_s")
        alone = f"{alone:.1f}" if alone is not None else "-"
        lines.append(
            f"| {r['config']} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | "
            f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['latency_p50_ms']:.1f} | "
            f"{r['latency_p99_ms']:.1f} | {r['spec_decode_num_drafts']:.0f} | "
            f"{r['spec_decode_num_draft_tokens']:.0f} | "
            f"{r['spec_decode_num_accepted_tokens']:.0f} | {rate} | {alone} | "
            + " ".join(f"{t:.0f}" for t in r["tokens_per_s_per_pass"]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
