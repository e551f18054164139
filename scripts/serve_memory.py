"""Memory over 1,000 requests through `speculant serve --max-batch 8`, and nothing lost or
duplicated in any answer (issue 40, Evidence: "memory flat over 1,000 requests through the
server").

    uv run --extra cpu python scripts/serve_memory.py --out docs/evidence/serve-memory-1000

Writes the tests' tiny export pair with a batched target graph of 8 rows (tests/export's
seeded weights; 64 positions a row) to a temporary folder, computes every distinct request's
answer alone in this process (``engine.generate``, batch 1), then starts ``speculant serve
PACKAGE --max-batch 8`` as a subprocess and sends ``--requests`` short completions from
``--clients`` threads at once (more clients than rows: the rest wait in the admission queue),
every other one streamed. Each answer must equal its request's answer alone, text for text
(a piece lost or sent twice changes it), with the finish reason and token count; every
request is answered exactly once. The server's resident memory (``VmRSS``) is sampled after
every ``--sample-every`` answers; after the first ``--warmup`` answers it may grow at most
``--max-growth-mib`` (3: a server keeping every finished request, about 7 KiB each, grew
5.8 MiB over the 800 after warm-up when planted; a clean one grows well under 1). Exit status
1 when any check fails. Bounded: about 1,000 requests of at
most 12 tokens: about 20 s on 2 cores. tests/serve/test_serve_memory.py runs it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tests/export: the tiny seeded models

PROMPTS = ["0123", "abc", "9:;<=", "ABAB", "@@@", "XYZ", "QRST", "5555", "=<;:", "_^]\\"]
MAX_TOKENS = [4, 6, 8, 10, 12]
ROWS = 8


def write_package(folder: Path) -> Path:
    from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
    from speculant_tools.export import write_pair_package

    return write_pair_package(folder / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                              write_tokenizer(folder / "tokenizer.json"), graph="explicit",
                              cache="static", batch=ROWS)


def answers_alone(package: Path) -> dict[tuple[str, int], tuple[str, str, int]]:
    """(prompt, max_tokens) -> (text, finish_reason, tokens), each decoded by itself."""
    import speculant

    engine = speculant.load(package)
    alone = {}
    for prompt in PROMPTS:
        for n in MAX_TOKENS:
            result = engine.generate(prompt, max_new_tokens=n, temperature=0.0)
            alone[prompt, n] = (result.text, result.finish_reason, len(result.token_ids))
    return alone


def start_server(package: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "speculant", "serve", str(package),
                               "--port", str(port), "--log-level", "error", "--threads", "1",
                               "--max-batch", str(ROWS), "--model-name", "pair"])
    deadline = time.monotonic() + 120
    while True:
        try:
            status, _ = exchange(port, "GET", "/health")
            if status == 200:
                return server, port
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.2)


def exchange(port: int, method: str, path: str, body: dict | None = None
             ) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(method, path, json.dumps(body) if body is not None else None,
                           {"Content-Type": "application/json"} if body is not None else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def answer_of(status: int, raw: bytes, is_streamed: bool) -> tuple[str, str, int] | str:
    """(text, finish_reason, completion tokens), or what was wrong with the answer."""
    if status != 200:
        return f"status {status}: {raw[:200]!r}"
    if not is_streamed:
        body = json.loads(raw)
        choice = body["choices"][0]
        return choice["text"], choice["finish_reason"], body["usage"]["completion_tokens"]
    events = [line[len(b"data: "):] for line in raw.splitlines() if line.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        return "the stream did not end with [DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    if any("error" in chunk for chunk in chunks):
        return f"an error event: {chunks[-1]}"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    usage = [c["usage"] for c in chunks if c.get("usage")]
    return (text, chunks[-2]["choices"][0]["finish_reason"] if usage else
            chunks[-1]["choices"][0]["finish_reason"],
            usage[-1]["completion_tokens"] if usage else -1)


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else platform.machine()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--sample-every", type=int, default=50)
    parser.add_argument("--max-growth-mib", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def main() -> int:
    args = arguments()
    with tempfile.TemporaryDirectory() as folder:
        report = measure(Path(folder), args)
    report["command"] = "uv run --extra cpu python scripts/serve_memory.py" + (
        f" --out {args.out}" if args.out else "")
    report["machine"] = (f"{os.cpu_count()} CPUs ({cpu_model()}), Python "
                         f"{platform.python_version()}, {platform.system()} "
                         f"{platform.release()}")
    text = render(report)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0 if report["passed"] else 1


def measure(folder: Path, args: argparse.Namespace) -> dict:
    """The whole run in ``folder`` (the package is written there); the report."""
    package = write_package(folder)
    alone = answers_alone(package)
    server, port = start_server(package)
    try:
        return drive(port, server.pid, alone, args)
    finally:
        server.terminate()
        server.wait(timeout=30)


def drive(port: int, pid: int, alone: dict, args: argparse.Namespace) -> dict:
    """Send the requests from ``args.clients`` threads; check every answer; sample RSS."""
    keys = list(alone)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(args.requests):
        todo.put(i)
    answered: dict[int, list] = {i: [] for i in range(args.requests)}
    samples: list[tuple[int, float]] = [(0, rss_mib(pid))]
    lock = threading.Lock()

    def client() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            prompt, n = keys[i % len(keys)]
            is_streamed = i % 2 == 0
            body = {"model": "pair", "prompt": prompt, "max_tokens": n, "temperature": 0,
                    "stream": is_streamed}
            if is_streamed:
                body["stream_options"] = {"include_usage": True}
            try:
                got = answer_of(*exchange(port, "POST", "/v1/completions", body), is_streamed)
            except (OSError, ValueError, KeyError, IndexError) as error:
                got = f"{type(error).__name__}: {error}"
            with lock:
                answered[i].append(got)
                done = sum(1 for a in answered.values() if a)
                if done % args.sample_every == 0:
                    samples.append((done, rss_mib(pid)))

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.monotonic() - started
    _, metrics = exchange(port, "GET", "/metrics")

    wrong = {i: got for i, got in answered.items()
             if len(got) != 1 or got[0] != alone[keys[i % len(keys)]]}
    after_warmup = [rss for done, rss in samples if done >= args.warmup]
    growth = max(after_warmup) - after_warmup[0] if after_warmup else float("nan")
    steps = _metric(metrics.decode(), "speculant:batch_size_count")
    rows = _metric(metrics.decode(), "speculant:batch_size_sum")
    return {"requests": args.requests, "clients": args.clients, "max_batch": ROWS,
            "wall_s": round(wall_s, 1), "answered_once_and_equal": args.requests - len(wrong),
            "wrong": {str(i): got for i, got in list(wrong.items())[:10]},
            "num_wrong": len(wrong), "rss_mib": [(d, round(r, 1)) for d, r in samples],
            "warmup": args.warmup, "rss_growth_after_warmup_mib": round(growth, 2),
            "max_growth_mib": args.max_growth_mib, "scheduler_steps": steps,
            "mean_rows_per_step": round(rows / steps, 2) if steps else None,
            "passed": not wrong and growth <= args.max_growth_mib}


def _metric(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def render(report: dict) -> str:
    rss = report["rss_mib"]
    lines = [
        "# 1,000 requests through `speculant serve --max-batch 8`: memory and answers", "",
        f"Command: `{report['command']}`  ",
        f"Machine: {report['machine']}", "",
        "| check | result |", "|---|---|",
        f"| requests sent ({report['clients']} clients at once, every other one streamed) "
        f"| {report['requests']} in {report['wall_s']} s |",
        f"| answered exactly once, text, finish reason and token count equal to the "
        f"request's answer alone | {report['answered_once_and_equal']} of "
        f"{report['requests']} |",
        f"| scheduler steps; mean rows per step (of {report['max_batch']}) "
        f"| {report['scheduler_steps']:.0f}; {report['mean_rows_per_step']} |",
        f"| server RSS after warm-up ({report['warmup']} answers) -> end | "
        f"{[r for d, r in rss if d >= report['warmup']][0]} MiB -> {rss[-1][1]} MiB |",
        f"| RSS growth after warm-up (bound {report['max_growth_mib']} MiB) "
        f"| {report['rss_growth_after_warmup_mib']} MiB |",
        f"| passed | {report['passed']} |", "",
        "RSS (MiB) by answers received: " + ", ".join(f"{d}: {r}" for d, r in rss), "",
    ]
    if report["wrong"]:
        lines += ["Wrong answers (first 10):", "", "```",
                  json.dumps(report["wrong"], indent=1), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
