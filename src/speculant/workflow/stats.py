"""`DecodeStats`: the counters of one decode, in the glossary's words (evidence.md §2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    """Kept by the decode state's owner; every identity of evidence.md §2 holds on it."""

    proposer: str | None = None  # the proposer kind of the run (None: plain decode)
    rounds: int = 0  # rounds with k_r >= 1 (a proposal, a verification pass, a commit)
    greedy_steps: int = 0  # passes over the pending token alone (k_r = 0)
    target_passes: int = 0  # prefill + rounds + greedy steps
    drafts_proposed: int = 0  # sum of k_r
    accepted_drafts: int = 0  # sum of (a_r - 1)
    rejected_drafts: int = 0  # drafts_proposed - accepted_drafts
    rounds_with_first_draft_accepted: int = 0  # rounds with a_r >= 2
    full_accepts: int = 0  # rounds with a_r = k_r + 1 (bonus token)
    rollbacks: int = 0  # rounds with a_r <= k_r (a correction)
    rolled_back_positions: int = 0  # sum over rollbacks of (k_r + 1 - a_r)
    rolled_back_cells: int = 0  # rollbacks x len(rollback_state)
    proposer_invocations: int = 0  # k_r + 1 per round (chained), k_r (draft model), 0 (lookup)
    argmax_rows: int = 0  # score rows reduced to a token id by argmax (greedy)
    sampled_rows: int = 0  # score rows turned into T(row) and drawn from or verified against
    committed: int = 0  # N: tokens appended to the output
    trace: list[tuple[int, int]] = field(default_factory=list)  # (k_r, a_r) per round
    proposed_at: list[int] = field(default_factory=list)  # [i]: drafts proposed at position i+1
    accepted_at: list[int] = field(default_factory=list)  # [i]: drafts accepted at position i+1
    residency: dict[str, int] = field(default_factory=dict)  # the seam's counters, at the end
    stop_reason: str | None = None

    def record_round(self, k_r: int, a: int, num_rollback_cells: int) -> None:
        self.rounds += 1
        self.trace.append((k_r, a))
        self.drafts_proposed += k_r
        self.accepted_drafts += a - 1
        self.rejected_drafts += k_r - (a - 1)
        self.rounds_with_first_draft_accepted += a >= 2
        while len(self.proposed_at) < k_r:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for i in range(k_r):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < a - 1
        if a == k_r + 1:
            self.full_accepts += 1
        else:
            self.rollbacks += 1
            self.rolled_back_positions += k_r + 1 - a
            self.rolled_back_cells += num_rollback_cells

    @property
    def mean_accepted_length(self) -> float | None:
        """Mean of a_r over rounds: tokens committed per verification pass."""
        return sum(a for _, a in self.trace) / len(self.trace) if self.trace else None

    @property
    def acceptance_by_position(self) -> list[float]:
        """Fraction of drafts accepted at block position i + 1, among rounds that proposed it."""
        return [acc / prop for acc, prop in zip(self.accepted_at, self.proposed_at, strict=True)]

    def as_dict(self) -> dict:
        data = asdict(self)
        data["mean_accepted_length"] = self.mean_accepted_length
        data["acceptance_by_position"] = self.acceptance_by_position
        return data
