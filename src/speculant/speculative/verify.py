"""Verification: pure functions of the block and the target's choices (runtime.md §10-§11)."""

from __future__ import annotations

from collections.abc import Sequence


def greedy_accept(block: Sequence[int], target: Sequence[int]) -> int:
    """Accepted block positions ``a``: position 0 (the pending token) always, then each draft
    up to the first that differs from the target's choice there. ``1 <= a <= len(block)``.

    ``block = [p, d_1, …, d_k]``; ``target[i]`` is the target's choice after consuming
    ``block[0..i)`` (``target[0] = p``). ``target[a]`` is then the correction (``a <= k``)
    or the bonus (``a = k + 1``).
    """
    a = 1
    while a < len(block) and block[a] == target[a]:
        a += 1
    return a
