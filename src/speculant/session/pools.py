"""One ONNX Runtime intra-op thread pool for all CPU sessions of a process (docs/design/session.md).

Per-session pools that spin between runs starve each other where the target's and the
drafter's take turns on the same cores; stopping them after each run costs the hand-off. One
process-wide pool (``onnxruntime.set_global_thread_pool_sizes``) has no rival and keeps
spinning: the demo pair on 2 cores, greedy 1720 -> 1958 tok/s, chained k=2 1521 -> 1872.
Once it exists ONNX Runtime refuses any session a pool of its own (CUDA's too: "must be false
when using a global thread pool"), in speculant or not, so only the process's owner may allow
it: ``speculant`` (the console script) does, a program calls :func:`speculant.share_cpu_pool`;
a library process keeps per-session pools. Allowed, the first CPU session asking for
``threads`` N != 1 makes it with N (threads=1 needs no pool); every later session runs on it,
and a ``threads`` other than the pool's is recorded, not applied. A session is never made
without per-session threads unless the pool exists (ORT would run it on one thread, silently).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

NOT_ALLOWED = ("not allowed in this process: every other ONNX Runtime session of it would have "
               "to share the pool; speculant.share_cpu_pool() allows it, the CLI does")


@dataclass(frozen=True)
class PoolDecision:
    """Whether a CPU session runs on the process-wide pool: its size, or why not."""

    is_shared: bool
    detail: str  # shared: the pool (and a threads count not applied); per session: why

    def describe(self, sessions: str = "every CPU session") -> str:
        return (f"shared by {sessions} ({self.detail})" if self.is_shared
                else f"per session ({self.detail})")


class ProcessPool:
    """The process's pool, made by the first CPU session that can share one."""

    def __init__(self, make_pools: Callable[[int, int], None]) -> None:
        self.make_pools = make_pools  # (intra-op threads, inter-op threads); raises if made
        self.lock = threading.Lock()
        self.pool = ""  # what runs the sessions ("": no process-wide pool)
        self.threads: int | None = None  # its size as speculant asked it (None: ORT's default)
        self.refusal = ""  # why ORT made none (never retried)
        self.is_allowed = False  # by the process's owner (allow): other sessions must share it

    def allow(self) -> None:
        """The process's owner lets the next CPU session make the pool (once: not undone)."""
        self.is_allowed = True

    @property
    def exists(self) -> bool:
        return bool(self.pool)

    def decide(self, threads: int | None) -> PoolDecision:
        """The pool a CPU session asking for ``threads`` (None: ORT's default) runs on."""
        with self.lock:
            if self.is_allowed and not self.pool and not self.refusal and threads != 1:
                try:
                    self.make_pools(threads or 0, 1)
                    self.threads = threads
                    self.pool = (f"{threads} threads" if threads else
                                 "ONNX Runtime's default size") + ", spinning between runs"
                except Exception as exc:  # noqa: BLE001 - ORT's Fail: someone made them first
                    if "already" not in str(exc):
                        self.refusal = f"ONNX Runtime refused process-wide pools: {exc}"
                    else:
                        self.pool = ("ONNX Runtime's process-wide pools, made outside "
                                     "speculant: their size unknown here")
        if not self.pool:
            return PoolDecision(False, "threads=1: no pool" if threads == 1 else self.refusal
                                or NOT_ALLOWED)
        if threads == self.threads:
            return PoolDecision(True, self.pool)
        return PoolDecision(True, f"{self.pool}; threads={threads} not applied: ONNX Runtime "
                                  "gives no session its own pool once this one exists")
