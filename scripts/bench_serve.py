"""A bounded load test of `speculant serve`: N concurrent clients x M requests each.

    python scripts/bench_serve.py [PACKAGE] --clients 1,4,16 --requests 8 --max-tokens 64 \
        --config plain --config chained:2 --config prompt_lookup --out DIR
    python scripts/bench_serve.py --url http://host:8000 --model demo ...   # a running server

Without ``--url`` it starts ``speculant serve PACKAGE`` on a free local port (a subprocess,
so the clients do not share its interpreter) and stops it at the end. Each config is one
pass: every client sends its M requests one after another, streaming (``stream=true`` with
``include_usage``), with the config's speculative extension fields (``plain``: proposer
null; ``chained:4``, ``draft``, ``prompt_lookup:3``: that proposer, K drafts per round or its
default). Prompts are
the package's ``val_prompts.json`` (token ids) when it has one, else ``--prompt``.

Every config runs at each ``--clients`` count (``plain@4``: four clients). Reported per
config and count: requests/s and generated tokens/s over the pass's wall time, p50 and
p99 time to first token (first text piece), time per output token after it (TPOT) and
request latency, per-request tokens/s (p50), aggregate tokens/s over the config's one-client
run (× one at a time), as the client sees them,
and the server's speculative counters (/metrics) over the pass; with a started server, the
same requests through ``engine.generate`` in this process, one at a time, as a baseline
without HTTP. Writes ``results.json`` and
``results.md`` to ``--out``.

``--abuse`` then runs the abuse cases against the same server (a started one gets small limits,
``ABUSE_LIMITS``, so that each case takes seconds): a half-sent body, slow headers, a flood of
idle connections beyond ``--max-connections``, a flood of requests beyond ``--max-waiting``,
abandoned non-streamed requests, a request past its deadline, and (a started server) SIGTERM
with a half-sent request open. Each case reports what was tried, how many were handled right
(the documented status, connection closed in time, the next client served promptly) and
mishandled, in the table form of docs/evidence/hostile-2026-12/server.md. ``--rounds 0
--abuse``: the abuse cases alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai

# The limits of a server started for --abuse, as `speculant serve` options (seconds, counts).
ABUSE_LIMITS = {"--request-timeout": 2, "--max-waiting": 4, "--max-connections": 32,
                "--header-timeout": 2, "--body-timeout": 2, "--shutdown-timeout": 3,
                "--retry-after": 1}
SPEC_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total")


def main() -> None:
    args = _parse()
    server = None
    url = args.url
    load_before = os.getloadavg()
    if url is None:
        server, url = _start_server(args.package, args.threads,
                                    ABUSE_LIMITS if args.abuse else {}, args.serve_option)
    abuse: list[dict] = []
    try:
        _wait_healthy(url)
        model = args.model or _served_model(url)
        prompts = _prompts(args)
        runs = [f"{config}@{clients}" for clients in args.clients for config in args.config]
        passes: dict[str, list] = {run: [] for run in runs}
        for _ in range(args.rounds):  # configs interleaved, so load drifts hit them alike
            for config in runs:
                passes[config].append(asyncio.run(_run_pass(url, model, config, prompts,
                                                            args)))
        results = [_summary(config, config_passes) for config, config_passes in passes.items()
                   if config_passes]
        _add_scaling(results)
        if args.url is None and results:
            _add_engine_alone(results, prompts, args)
        if args.abuse:
            abuse = _run_abuse(url, model, args, server)
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
    report = {"command": " ".join(["python", *sys.argv]), "machine": _machine(),
              "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
              "package": args.package, "clients": args.clients,
              "requests_per_client": args.requests, "rounds": args.rounds,
              "max_tokens": args.max_tokens,
              "results": results, "abuse": abuse}
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
    parser.add_argument("--clients", type=lambda text: [int(n) for n in text.split(",")],
                        default=[4], help="concurrent clients; a list (1,4,16) runs each")
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
    parser.add_argument("--abuse", action="store_true",
                        help="then run the abuse cases (a started server gets ABUSE_LIMITS)")
    parser.add_argument("--serve-option", action="append", default=[],
                        help="an option for the started server, e.g. --serve-option=--max-batch"
                             " --serve-option=16 (repeatable)")
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


def _start_server(package: str, threads: int | None, limits: dict, options: list[str]
                  ) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads_args = ["--threads", str(threads)] if threads is not None else []
    limit_args = [str(part) for option, value in limits.items() for part in (option, value)]
    server = subprocess.Popen([sys.executable, "-m", "speculant", "serve", package,
                               "--port", str(port), "--log-level", "error", *threads_args,
                               *limit_args, *options])
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
    proposer, _, k = config.partition("@")[0].partition(":")
    extra = {"proposer": None} if proposer == "plain" else \
        {"proposer": proposer, "k": int(k) if k else None}

    async def one(prompt) -> dict:
        started = time.perf_counter()
        first_at, last_at, num_tokens = None, None, 0
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=args.max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=extra)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                last_at = time.perf_counter()
                first_at = first_at or last_at
            if chunk.usage is not None:
                num_tokens = chunk.usage.completion_tokens
        ended = time.perf_counter()
        first_at, last_at = first_at or ended, last_at or ended
        return {"ttft_s": first_at - started, "latency_s": ended - started,
                "num_tokens": num_tokens,  # time per output token after the first:
                "tpot_s": (last_at - first_at) / (num_tokens - 1) if num_tokens > 1 else None}

    async def client_loop(c: int) -> list[dict]:
        return [await one(prompts[(c * args.requests + r) % len(prompts)])
                for r in range(args.requests)]

    clients = int(config.rpartition("@")[2])

    await one(prompts[0])  # warm-up, not counted
    before = _spec_counters(url)
    started = time.perf_counter()
    per_client = await asyncio.gather(*(client_loop(c) for c in range(clients)))
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
    tpot = np.array([r["tpot_s"] for r in done if r["tpot_s"] is not None] or [np.nan])
    per_request = np.array([r["num_tokens"] / r["latency_s"] for r in done])
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
            "tpot_p50_ms": 1000 * float(np.percentile(tpot, 50)),
            "tpot_p99_ms": 1000 * float(np.percentile(tpot, 99)),
            "request_tokens_per_s_p50": float(np.percentile(per_request, 50)),
            **spec, "acceptance_rate": spec["spec_decode_num_accepted_tokens"] / drafts
            if drafts else None}


def _add_scaling(results: list[dict]) -> None:
    """Each run's aggregate tokens/s over its config's one-client run (one-at-a-time
    serving), where that run was made."""
    alone = {r["config"].partition("@")[0]: r["tokens_per_s"] for r in results
             if r["config"].endswith("@1")}
    for r in results:
        base = alone.get(r["config"].partition("@")[0])
        r["x_one_at_a_time"] = r["tokens_per_s"] / base if base else None


def _add_engine_alone(results: list[dict], prompts: list, args: argparse.Namespace) -> None:
    """The same requests through ``engine.generate`` in this process, one after another (no
    HTTP, no concurrency): tokens per second of decode time, beside each config."""
    from speculant import GenerationOptions
    from speculant.serve import load_engine

    engine = load_engine(args.package, threads=args.threads)
    for result in results:  # the same prompts as the passes: client c's r-th request
        config, _, clients = result["config"].partition("@")
        num_requests = int(clients) * args.requests
        proposer, _, k = config.partition(":")
        options = GenerationOptions(max_new_tokens=args.max_tokens,
                                    proposer=None if proposer == "plain" else proposer,
                                    k=int(k) if k else None)
        engine.generate(prompts[0], options)  # warm-up
        runs = [engine.generate(prompts[i % len(prompts)], options)
                for i in range(num_requests * args.rounds)]
        result["engine_alone_tokens_per_s"] = (sum(len(r.token_ids) for r in runs)
                                               / sum(r.total_s for r in runs))


def _run_abuse(url: str, model: str, args: argparse.Namespace,
               server: subprocess.Popen | None) -> list[dict]:
    """The abuse cases against the server at ``url`` (limits: ABUSE_LIMITS when started
    here; read from /health and the 429s otherwise), each {test, tried, right, detail}."""
    host, port = url.removeprefix("http://").split(":")
    where = (host, int(port))
    limits = {k.removeprefix("--"): v for k, v in ABUSE_LIMITS.items()}
    long_request = {"model": model, "prompt": args.prompt, "max_tokens": 100_000}
    cases = []

    def case(test: str, tried: int, right: int, detail: str) -> None:
        cases.append({"test": test, "tried": tried, "right": right, "detail": detail})
        print(f"abuse: {test}: {right}/{tried} handled right ({detail})", flush=True)

    def closed_after(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
        started, received = time.monotonic(), b""
        sock.settimeout(timeout_s)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except OSError:  # a timeout (still open) or a reset (closed)
            pass
        return received, time.monotonic() - started

    def probe() -> tuple[int, float]:
        started = time.monotonic()
        status, _, _ = _exchange(where, {"model": model, "prompt": args.prompt,
                                         "max_tokens": 4})
        return status, time.monotonic() - started

    # 1. half-sent bodies: 408, closed within the body timeout
    socks = [socket.create_connection(where) for _ in range(5)]
    for sock in socks:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{")
    outcomes = [closed_after(sock, limits["body-timeout"] + 10) for sock in socks]
    for sock in socks:
        sock.close()
    right = sum(a.startswith(b"HTTP/1.1 408") and t < limits["body-timeout"] + 5
                for a, t in outcomes)
    case("half-sent body (Content-Length 100, 1 byte)", len(socks), right,
         f"408 and closed after {max(t for _, t in outcomes):.1f} s at most")

    # 2. slow headers: half a request line, and a header trickled a byte every 0.3 s
    def slow_headers(trickle: bool) -> float:
        sock = socket.create_connection(where)
        started = time.monotonic()
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
            for byte in b"X-Slow: " + b"x" * 100 if trickle else b"":
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            return time.monotonic() - started
        _, waited = closed_after(sock, limits["header-timeout"] + 10)
        sock.close()
        return time.monotonic() - started if waited else waited
    waits = [slow_headers(trickle) for trickle in (False, True, False, True)]
    case("slow headers (silent, trickled)", len(waits),
         sum(w < limits["header-timeout"] + 3 for w in waits),
         f"closed after {max(waits):.1f} s at most")

    # 3. idle connections beyond the limit: refused at once, and a client served after
    idle = [socket.create_connection(where) for _ in range(limits["max-connections"])]
    extra = [socket.create_connection(where) for _ in range(50)]
    answers = [closed_after(sock, 5)[0] for sock in extra]
    for sock in idle + extra:
        sock.close()
    time.sleep(0.2)
    status, latency = probe()
    right = sum(a.startswith(b"HTTP/1.1 503") and b"retry-after" in a for a in answers)
    case(f"idle connection flood ({len(idle)} held + {len(extra)} over the limit)",
         len(extra) + 1, right + (status == 200 and latency < 5),
         f"503 + Retry-After and closed; then a client served in {latency:.2f} s")

    # 4. a request flood beyond the queue: 429 + Retry-After, the rest answered
    results: list[tuple[int, dict]] = []
    flood = [threading.Thread(target=lambda: results.append(_exchange(where, long_request)[:2]))
             for _ in range(limits["max-waiting"] + 11)]
    for thread in flood:
        thread.start()
        time.sleep(0.02)
    for thread in flood:
        thread.join(timeout=60)
    num_429 = sum(s == 429 and "retry-after" in h for s, h in results)
    num_served = sum(s in (200, 504) for s, _ in results)
    case(f"request flood ({len(flood)} long requests, queue {limits['max-waiting']})",
         len(flood), num_429 + num_served,
         f"{num_429} × 429 + Retry-After, {num_served} answered (200, or 504 at the deadline)")

    # 5. abandoned non-streamed requests: stopped, the next client served promptly
    aborted_before = _counter(url, "request_success_total", 'finished_reason="abort"')
    for _ in range(4):
        sock = socket.create_connection(where)
        body = json.dumps(long_request).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
        sock.close()
    status, latency = probe()
    num_aborted = _counter(url, "request_success_total", 'finished_reason="abort"') - \
        aborted_before
    case("abandoned non-streamed requests (4, clients gone after 0.3 s)", 5,
         int(num_aborted) + (status == 200 and latency < 5),
         f"{num_aborted:.0f} counted abort; the next client served in {latency:.2f} s")

    # 6. a request past its deadline: 504 in time (or 200 before it), and a stream's last
    # event says so (or it ended before the deadline)
    deadline = limits["request-timeout"]
    started = time.monotonic()
    status, _, body = _exchange(where, long_request)
    waited = time.monotonic() - started
    started = time.monotonic()
    _, _, streamed = _exchange(where, {**long_request, "stream": True})
    streamed_s = time.monotonic() - started
    is_stream_right = streamed.endswith(b"[DONE]\n\n") and (
        b"deadline_exceeded" in streamed or streamed_s < deadline)
    is_plain_right = (status == 504 and waited < deadline + 3) or \
        (status == 200 and waited < deadline)
    case(f"deadline ({deadline} s; a decode of the whole context, plain and streamed)", 2,
         is_plain_right + is_stream_right,
         f"plain: {status} after {waited:.1f} s; streamed: "
         f"{'deadline_exceeded' if b'deadline_exceeded' in streamed else 'finished'} "
         f"after {streamed_s:.1f} s")

    # 7. SIGTERM with a half-sent request open: exits within the shutdown timeout
    if server is not None:
        sock = socket.create_connection(where)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                     b"\r\n{")
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=limits["shutdown-timeout"] + 10)
        except subprocess.TimeoutExpired:
            pass
        waited = time.monotonic() - started
        sock.close()
        case("SIGTERM with a half-sent request open", 1,
             int(server.poll() is not None and waited < limits["shutdown-timeout"] + 5),
             f"exited after {waited:.1f} s")
    return cases


def _exchange(where: tuple[str, int], body: dict) -> tuple[int, dict, bytes]:
    import http.client

    connection = http.client.HTTPConnection(*where, timeout=120)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    except OSError as error:
        return 0, {"error": str(error)}, b""
    finally:
        connection.close()


def _counter(url: str, name: str, label: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics") as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(rf"^speculant:{name}\{{[^}}]*{label}[^}}]*\}} (\S+)$",
                                            text, re.M))


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
             "| config@clients | req/s | tok/s | × one at a time | tok/s per request p50 | "
             "TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | latency p50 ms | "
             "latency p99 ms | drafts | draft tokens | accepted | acceptance | "
             "engine alone tok/s | tok/s per pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        rate = f"{r['acceptance_rate']:.2f}" if r["acceptance_rate"] is not None else "-"
        alone = r.get("engine_alone_tokens_per_s")
        alone = f"{alone:.1f}" if alone is not None else "-"
        scale = f"{r['x_one_at_a_time']:.2f}×" if r.get("x_one_at_a_time") else "-"
        lines.append(
            f"| {r['config']} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | {scale} | "
            f"{r['request_tokens_per_s_p50']:.1f} | "
            f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['tpot_p50_ms']:.1f} | "
            f"{r['tpot_p99_ms']:.1f} | {r['latency_p50_ms']:.1f} | "
            f"{r['latency_p99_ms']:.1f} | {r['spec_decode_num_drafts']:.0f} | "
            f"{r['spec_decode_num_draft_tokens']:.0f} | "
            f"{r['spec_decode_num_accepted_tokens']:.0f} | {rate} | {alone} | "
            + " ".join(f"{t:.0f}" for t in r["tokens_per_s_per_pass"]) + " |")
    if report["abuse"]:
        lines += ["", "| test | inputs tried | handled right | mishandled | detail |",
                  "|---|---|---|---|---|"]
        lines += [f"| {a['test']} | {a['tried']} | {a['right']} | {a['tried'] - a['right']} | "
                  f"{a['detail']} |" for a in report["abuse"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
