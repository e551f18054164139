"""Greedy acceptance where the scores are (issue 12 item 4): the round's drafts and the
target's choices are compared on their residency, so that the host reads back only the
committed ids and their count, once per round. The host runs this rule over numpy; the CUDA
backend runs it as one kernel (``cuda_kernels.accept_greedy``), tested element for element
against it.
"""

from __future__ import annotations

from typing import Any


def accept_greedy(xp: Any, drafts: Any, choices: Any) -> Any:
    """``[a, c_1 … c_a, …]`` as ``[k + 2]`` int32 for the drafts ``d_1 … d_k`` ``[k]`` and the
    target's choices ``[k + 1]`` (the argmax of verification rows ``0 … k``: row ``i`` scores
    the token after block position ``i``).

    ``a − 1`` is the number of leading drafts equal to the choice before them
    (``d_j == choices[j − 1]``); the committed tokens are those drafts and then
    ``choices[a − 1]``, the correction (``a ≤ k``) or the bonus (``a = k + 1``): what
    ``speculative.verify.greedy_accept`` gives on the host. Slots past ``1 + a`` hold
    the later choices and are never read.
    """
    k = drafts.shape[0]
    matches = (drafts == choices[:k]).astype(xp.int32)  # [k] 1 where d_j is the target's choice
    count = (xp.cumprod(matches).sum() + 1).reshape(1)  # [1]: a (a − 1 leading matches)
    # a leading accepted draft equals the choice it was compared with: the committed ids
    # d_1 … d_{a−1}, choices[a − 1] are choices[0 … a − 1]
    return xp.concatenate([count.astype(xp.int32), choices.astype(xp.int32)])  # [k + 2]
