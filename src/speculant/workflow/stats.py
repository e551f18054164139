"""`DecodeStats`: a decode's counters, in the glossary's words (docs/design/spec/evidence.md §2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    """Kept by the decode state's owner; every accounting identity (drafts = accepted +
    rejected, ...) holds on it."""

    proposer: str | None = None  # the proposer kind of the run (None: plain decode)
    route: str | None = None  # how its rounds ran and why (speculative/decode.choose_route)
    seed: int | None = None  # the seed it sampled with (the request's or a fresh one); greedy: None
    acceptance: str | None = None  # "gumbel" or "rejection" when sampling (workflow/sampler.py)
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
    rollback_bytes_moved: int = 0  # bytes rollback copied (truncation); 0 for static caches
    proposer_invocations: int = 0  # k_r + 1 per round (chained), k_r (draft model), 0 (lookup)
    argmax_rows: int = 0  # score rows reduced to a token id by argmax (greedy)
    sampled_rows: int = 0  # score rows turned into T(row) and drawn from or verified against
    committed: int = 0  # N: tokens appended to the output
    queued_passes: int = 0  # target passes queued on the device behind one not read yet
    trace: list[tuple[int, int]] = field(default_factory=list)  # (k_r, a_r) per round
    proposed_at: list[int] = field(default_factory=list)  # [i]: drafts proposed at position i+1
    accepted_at: list[int] = field(default_factory=list)  # [i]: drafts accepted at position i+1
    residency: dict[str, int] = field(default_factory=dict)  # the seam's counters, at the end
    cuda_graphs: str | None = None  # per session: "captured per width, replayed" | "eager (why)"
    cpu_pool: str | None = None  # "shared by ... (N threads, ...)" | "per session (why)"
    stop_reason: str | None = None

    # The decode state (workflow/state.py) is the only caller of the record_* methods.
    def record_prefill(self, is_sampling: bool) -> None:
        self.target_passes += 1
        self._record_rows(1, is_sampling)

    def record_pass(self, k: int, num_accepted: int, num_proposer_invocations: int,
                    num_proposer_rows: int, is_sampling: bool, num_rollback_cells: int,
                    is_queued: bool = False) -> None:
        """One verification pass over ``k`` drafts (0: a greedy step) of which
        ``num_accepted - 1`` were accepted (``is_queued``: behind a pass not read yet)."""
        self.target_passes += 1
        self.queued_passes += is_queued
        self.proposer_invocations += num_proposer_invocations
        self._record_rows(num_proposer_rows + k + 1, is_sampling)
        if k == 0:
            self.greedy_steps += 1
            return
        self.rounds += 1
        self.trace.append((k, num_accepted))
        self.drafts_proposed += k
        self.accepted_drafts += num_accepted - 1
        self.rejected_drafts += k - (num_accepted - 1)
        self.rounds_with_first_draft_accepted += num_accepted >= 2
        while len(self.proposed_at) < k:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for i in range(k):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted - 1
        if num_accepted == k + 1:
            self.full_accepts += 1
        else:
            self.rollbacks += 1
            self.rolled_back_positions += k + 1 - num_accepted
            self.rolled_back_cells += num_rollback_cells

    def record_commit(self, num_tokens: int) -> None:
        self.committed += num_tokens

    def _record_rows(self, num_rows: int, is_sampling: bool) -> None:
        if is_sampling:
            self.sampled_rows += num_rows
        else:
            self.argmax_rows += num_rows

    @property
    def drafts_accepted(self) -> int:
        """The serving metrics' name for :attr:`accepted_drafts`."""
        return self.accepted_drafts

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
