"""A fixture package with a chat template, served on 127.0.0.1 in a thread, and the official
``openai`` client pointed at it.

``serve_app(app)`` starts any app (a uvicorn server in a daemon thread, on a free port) and
returns its base URL; ``serve_app(app, limits)`` starts it as `speculant serve` does, under
those ServerLimits (uvicorn's settings and the guarded connection protocol). The servers stop
at the end of the session. ``batched_pair``: a tiny package with a batched target graph
(``--max-batch``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Ray's workers run on this interpreter: under `uv run`, Ray would otherwise start each
# worker with `uv run` in a copy of the working tree, in a fresh environment (read at import).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

pytest.importorskip("fastapi", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")

import uvicorn  # noqa: E402

from builders.writers import write_chained_package  # noqa: E402
from speculant.serve import load_engine  # noqa: E402
from speculant.serve.app import create_app  # noqa: E402
from speculant.serve.limits import uvicorn_config  # noqa: E402

MODEL = "fixture"
BATCHED_ROWS = 4
# Only characters of the fixture vocabulary (letters, space, parentheses, newline).
CHAT_TEMPLATE = ("{% for m in messages %}({{ m.role }}) {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}(assistant) {% endif %}")


def write_chat_package(root: Path) -> Path:
    write_chained_package(root)
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "</s>"}))
    return root


@pytest.fixture(scope="session")
def chat_package(tmp_path_factory) -> Path:
    return write_chat_package(tmp_path_factory.mktemp("serve") / "fixture")


@pytest.fixture(scope="session")
def batched_pair(tmp_path_factory) -> Path:
    """The export tests' tiny pair with static caches and a batched target graph of
    :data:`BATCHED_ROWS` rows (its tokens: one per character from "0"; 64 positions a row)."""
    from export.export_models import CONFIG, DRAFTER_WEIGHTS, TARGET_WEIGHTS, write_tokenizer
    from speculant_tools.export import write_pair_package

    base = tmp_path_factory.mktemp("batched-pair")
    return write_pair_package(base / "pair", TARGET_WEIGHTS, CONFIG, DRAFTER_WEIGHTS,
                              write_tokenizer(base / "tokenizer.json"), graph="explicit",
                              cache="static", batch=BATCHED_ROWS)


@pytest.fixture(scope="session")
def engine(chat_package):
    return load_engine(str(chat_package))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_app() -> Iterator[Callable[..., str]]:
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app, limits=None) -> str:
        port = _free_port()
        config = uvicorn_config(app, limits, host="127.0.0.1", port=port,
                                log_level="warning") if limits is not None else \
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=5)


@pytest.fixture(scope="session")
def app(engine):
    return create_app(engine, MODEL)


@pytest.fixture(scope="session")
def base_url(serve_app, app) -> str:
    return serve_app(app)


@pytest.fixture(scope="session")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def exchange_with(base_url: str) -> Callable[..., tuple[int, dict, bytes]]:
    """``exchange(method, path, body=b"", headers=...)``: one plain HTTP/1.1 exchange with
    the server at ``base_url`` (bodies and headers exactly as given) -> (status, headers,
    body)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(base_url)

    def exchange(method: str, path: str, body: bytes | str = b"",
                 headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        headers = headers or {}
        try:
            try:
                connection.request(method, path, body=body, headers=headers,
                                   encode_chunked="Transfer-Encoding" in headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered before the whole body was sent (413)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()
    return exchange


@pytest.fixture(scope="session")
def raw_at() -> Callable[[str], Callable[..., tuple[int, dict, bytes]]]:
    """``raw_at(base_url)``: :func:`exchange_with` for another server of the session."""
    return exchange_with


@pytest.fixture(scope="session")
def raw(base_url) -> Callable[..., tuple[int, dict, bytes]]:
    """One plain HTTP/1.1 exchange with the session's server (:func:`exchange_with`)."""
    return exchange_with(base_url)
