"""Chat templates rendered in a worker process, bounded in time, output and memory.

A chat template is code that the package supplies (or that ``speculant import`` copied from a
GGUF file). jinja2's sandbox keeps it from reaching Python, but not from looping 10¹⁰ times
or building a string of gigabytes. So templates are compiled and rendered here, in one child
process per :class:`TemplateLimits`, and never in the caller's process:

* **deadline**: the caller waits ``deadline_s`` for a render's answer, then kills the worker
  (a fresh one starts at the next render). The worker also arms ``SIGALRM`` for each render,
  so it dies alone if its parent is gone.
* **output cap**: the worker stops a render once its text passes ``max_output_chars``.
* **memory**: the worker's address space is capped at ``max_memory_bytes``
  (``resource.setrlimit``); a render that needs more ends in ``MemoryError`` there.

The worker starts at the first render, then serves every later one (a render costs a round
trip through two pipes, not a process start); renders through one worker run one at a time,
and one waits for the worker at most ``WAIT_DEADLINES`` deadlines (a burst of slow renders
holds no caller's thread longer than that).
It imports nothing of speculant (it runs this file by its path: the package's ``__init__``
loads ONNX Runtime), ignores SIGINT (Ctrl-C is its parent's), and exits when its parent closes
its stdin. Frames, both ways: an 8-byte big-endian length, then a JSON document in ASCII.
Answers are JSON, never pickles: the side that runs the template sends only data.

Every failure is a :class:`RenderFailure` whose ``kind`` says which bound or rule ended it;
``speculant.text.chat`` turns it into the typed error that names the template's file.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

FRAME = struct.Struct(">Q")
START_TIMEOUT_S = 60.0  # a worker's start (a Python process importing jinja2), not a render
BACKSTOP_GRACE_S = 10.0  # the worker's own alarm: the deadline plus this
WAIT_DEADLINES = 3  # a render waits for the worker at most this many deadlines
MAX_MESSAGE_CHARS = 400  # an exception's text, as the worker reports it
KINDS = ("refused", "compile", "failed", "too_long")  # the failures a worker reports itself
BOOT = ("import importlib.util, sys; "
        "spec = importlib.util.spec_from_file_location('speculant_template_worker', sys.argv[1]); "
        "module = importlib.util.module_from_spec(spec); "
        "sys.modules[spec.name] = module; spec.loader.exec_module(module); module.serve()")


@dataclass(frozen=True)
class TemplateLimits:
    """The bounds of one render; these defaults are the engine's and the server's."""

    deadline_s: float = 2.0  # wall time of one render
    max_output_chars: int = 1 << 22  # 4 Mi characters of rendered text
    max_memory_bytes: int = 1 << 30  # the worker's address space

    def checked(self) -> TemplateLimits:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
                    or value == float("inf"):
                raise ValueError(f"TemplateLimits.{name} must be a positive finite number, "
                                 f"not {value!r}")
        return self


DEFAULT_LIMITS = TemplateLimits()


class RenderFailure(Exception):
    """A render that gave no text. ``kind``: ``refused`` (a ``jinja2.TemplateError``: the
    template's ``raise_exception``, the sandbox, an undefined name), ``compile`` (the source
    does not compile), ``failed`` (any other exception: RecursionError, MemoryError, a
    TypeError from ``include`` ...), ``too_long`` (the output cap), ``deadline``, ``died``
    (the worker ended mid-render), ``data`` (the variables are not JSON data), ``busy``
    (other renders held the worker for ``WAIT_DEADLINES`` deadlines)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TemplateWorker:
    """The parent's handle on one worker process: started lazily, restarted after a kill."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits.checked()
        self._process: subprocess.Popen | None = None
        self._pid = 0  # the process that started the worker (a fork starts its own)
        self._lock = threading.Lock()
        # an answer's JSON: the text, each character escaped at worst, and a little more
        self._max_answer_bytes = 12 * int(self.limits.max_output_chars) + 4096

    def render(self, source: str, variables: dict) -> str:
        """``source`` rendered with ``variables`` (JSON data), or a :class:`RenderFailure`."""
        try:
            request = _frame({"source": source, "variables": variables})
        except (TypeError, ValueError, RecursionError) as error:
            raise RenderFailure("data", f"not JSON data: {error}") from None
        if not self._lock.acquire(timeout=WAIT_DEADLINES * self.limits.deadline_s):
            raise RenderFailure("busy", f"found the template worker busy for "
                                f"{WAIT_DEADLINES * self.limits.deadline_s:g} s")
        try:
            for attempt in (1, 2):  # a worker that dies is replaced, and the render retried once
                process = self._started()
                try:
                    _write_all(process.stdin.fileno(), request)
                    answer = _read_frame(process.stdout.fileno(),
                                         time.monotonic() + self.limits.deadline_s,
                                         self._max_answer_bytes)
                    break
                except TimeoutError:
                    self._stop()
                    raise RenderFailure("deadline", f"did not finish within "
                                        f"{self.limits.deadline_s:g} s") from None
                except (OSError, EOFError, ValueError, RecursionError):  # a closed pipe, an
                    # end, a frame of no known form
                    code = self._stop()
                    if attempt == 2:
                        raise RenderFailure("died", f"the template worker died while "
                                            f"rendering (exit status {code})") from None
                except BaseException:  # interrupted (Ctrl-C): its answer would come late
                    self._stop()
                    raise
            if not isinstance(answer, dict) or answer.get("restart"):  # out of memory, or
                self._stop()  # an answer of no known shape: its heap is not to be trusted
        finally:
            self._lock.release()
        if isinstance(answer, dict) and isinstance(answer.get("text"), str):
            return answer["text"]
        if isinstance(answer, dict) and answer.get("kind") in KINDS \
                and isinstance(answer.get("message"), str):
            raise RenderFailure(answer["kind"], answer["message"])
        raise RenderFailure("died", "the template worker answered with no text and no error")

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> subprocess.Popen:
        if self._process is not None and self._pid == os.getpid() \
                and self._process.poll() is None:
            return self._process
        if self._pid == os.getpid():
            self._stop()
        self._process = subprocess.Popen(  # -P: no working directory on sys.path
            [sys.executable, "-P", "-c", BOOT, os.path.abspath(__file__),
             json.dumps(asdict(self.limits))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)  # the terminal's signals are the parent's
        self._pid = os.getpid()
        try:
            _read_frame(self._process.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
        except (TimeoutError, EOFError, ValueError):
            code = self._stop()
            raise RenderFailure("died", f"the template worker did not start (exit status "
                                f"{code}; it runs {sys.executable} and imports jinja2)") \
                from None
        return self._process

    def _stop(self) -> int | None:
        process, self._process = self._process, None
        if process is None or self._pid != os.getpid():
            return None
        process.kill()
        code = process.wait()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        return code


_WORKERS: dict[TemplateLimits, TemplateWorker] = {}
_WORKERS_LOCK = threading.Lock()


def worker_for(limits: TemplateLimits) -> TemplateWorker:
    """The process's one worker for ``limits`` (every template with these limits shares it)."""
    with _WORKERS_LOCK:
        if limits not in _WORKERS:
            _WORKERS[limits] = TemplateWorker(limits)
        return _WORKERS[limits]


@atexit.register
def _close_workers() -> None:
    for worker in list(_WORKERS.values()):
        worker.close()


def _frame(document: dict) -> bytes:
    data = json.dumps(document, ensure_ascii=True).encode("ascii")
    return FRAME.pack(len(data)) + data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_frame(fd: int, deadline: float, max_bytes: int = 4096) -> dict:
    """One frame from ``fd``: TimeoutError past ``deadline``, EOFError at the end,
    ValueError for one longer than ``max_bytes`` or not JSON."""
    size = FRAME.unpack(_read_exactly(fd, FRAME.size, deadline))[0]
    if size > max_bytes:
        raise ValueError(f"a frame of {size} bytes")
    return json.loads(_read_exactly(fd, size, deadline))


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks, missing = [], size
    while missing:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


# -- the worker's side (runs in the child; imports only jinja2) ---------------------------------
def serve() -> None:
    """The worker's loop: read a request, render it, answer; exit at the end of stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limits = TemplateLimits(**json.loads(sys.argv[2]))
    environment = _environment()
    compiled: dict[str, object] = {}  # source -> template, the last few
    _limit_resources(limits.max_memory_bytes)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(_frame({"ready": True}))
    stdout.flush()
    while len(header := stdin.read(FRAME.size)) == FRAME.size:
        request = json.loads(stdin.read(FRAME.unpack(header)[0]))
        signal.setitimer(signal.ITIMER_REAL, limits.deadline_s + BACKSTOP_GRACE_S)
        answer = _answer(environment, compiled, request, limits.max_output_chars)
        signal.setitimer(signal.ITIMER_REAL, 0)
        stdout.write(_frame(answer))
        stdout.flush()


def _environment():
    """transformers' environment: the immutable sandbox, ``trim_blocks``, ``lstrip_blocks``,
    loop controls, ``raise_exception`` and a ``tojson`` that keeps non-ASCII text."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
        value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    return environment


def _limit_resources(max_memory_bytes: int) -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system: the deadline and the output cap still hold
        return
    for name, limit in (("RLIMIT_AS", max_memory_bytes), ("RLIMIT_CORE", 0),
                        ("RLIMIT_FSIZE", 0)):
        which = getattr(resource, name, None)
        if which is None:
            continue
        _, hard = resource.getrlimit(which)
        soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass


def _answer(environment, compiled: dict, request: dict, max_chars: int) -> dict:
    import jinja2

    source = request["source"]
    try:
        if source not in compiled:
            if len(compiled) >= 8:
                compiled.pop(next(iter(compiled)))
            compiled[source] = environment.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as error:
        return _failure("compile", error)
    except Exception as error:  # noqa: BLE001 (RecursionError, MemoryError ... while compiling)
        return _failure("compile", error, with_type=True)
    try:
        pieces, size = [], 0
        for piece in compiled[source].generate(**request["variables"]):
            size += len(piece)
            if size > max_chars:
                return {"kind": "too_long", "message": f"rendered more than {max_chars} "
                                                       f"characters"}
            pieces.append(piece)
        return {"text": "".join(pieces)}
    except jinja2.exceptions.TemplateError as error:
        return _failure("refused", error)
    except Exception as error:  # noqa: BLE001 (a template may raise anything; each is reported)
        return _failure("failed", error, with_type=True)


def _failure(kind: str, error: BaseException, *, with_type: bool = False) -> dict:
    """The answer for ``error``; after a MemoryError the worker is replaced."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 (a message that cannot be built, e.g. a huge int)
        text = ""
    text = text[:MAX_MESSAGE_CHARS]
    if with_type:
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return {"kind": kind, "message": text, "restart": isinstance(error, MemoryError)}
