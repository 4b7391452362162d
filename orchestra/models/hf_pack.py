"""Planning log-likelihood forward passes: shared prefixes, token budgets and packed rows.

A request's choices share their context, so the context is read once: the request becomes a
:class:`Group` (the shared prefix, then one branch per choice), and a forward pass reads
the prefix and every branch in one sequence whose attention mask lets each branch see the
prefix and itself only.  Groups sorted longest first are cut into forward passes of at
most ``max_tokens`` padded tokens, and short groups are packed side by side into one row
(first fit, decreasing), so padding is nearly gone without making any row longer.

Pure Python: :mod:`orchestra.models.hf_score` turns a :class:`PackedBatch` into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from orchestra.models.hf_common import LoglikRow


@dataclass(frozen=True)
class Branch:
    """The tokens of one scored row after its group's prefix; the last ``n`` are scored."""

    slot: int  # index of the row in the list being scored: where its value goes
    ids: list[int]
    n: int


@dataclass(frozen=True)
class Group:
    """Rows read together: a prefix read once, and branches that each see it and themselves."""

    prefix: list[int]
    branches: tuple[Branch, ...]

    @cached_property
    def size(self) -> int:
        """Tokens of the group (asked for many times while passes are planned: kept)."""
        return len(self.prefix) + sum(len(b.ids) for b in self.branches)


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    k = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < k and s[i] == first[i]:
            i += 1
        k = i
    return k


def group_rows(rows: Sequence[LoglikRow], share_prefix: bool = True) -> list[Group]:
    """The groups that score ``rows``: one per request (its rows' longest common prefix read
    once) with ``share_prefix``, else one per row (its unscored tokens as the prefix).

    A prefix never reaches into a row's scored tokens, so every branch holds all the tokens
    it scores; the token before a branch's first scored one is then in the branch or is the
    prefix's last token, the one position every branch of the group sees.
    """
    if not share_prefix:
        return [
            Group(list(r.ids[: len(r.ids) - r.n]), (Branch(i, list(r.ids[len(r.ids) - r.n :]), r.n),))
            for i, r in enumerate(rows)
        ]
    by_request: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_request.setdefault(r.request, []).append(i)
    groups = []
    for idxs in by_request.values():
        seqs = [rows[i].ids for i in idxs]
        p = min(_common_prefix(seqs), *(len(rows[i].ids) - rows[i].n for i in idxs))
        branches = tuple(Branch(i, list(rows[i].ids[p:]), rows[i].n) for i in idxs)
        groups.append(Group(list(seqs[0][:p]), branches))
    return groups


@dataclass
class PackedBatch:
    """One forward pass: ``rows`` rows of ``width`` tokens, flattened row by row.

    Per token: ``ids``, ``positions`` (each branch continues the positions of its prefix),
    ``segment`` (which group of the row, -1 for padding) and ``branch`` (0 for a prefix
    token, ``j`` for the j-th branch of its group).  Token ``a`` attends to token ``b`` when
    ``b == a``, or ``b < a`` in the same segment and ``b`` is in the prefix or in ``a``'s
    branch.  ``scored``: for each scored token, the flat index of the position whose logits
    predict it (``pred_index``), the token (``targets``) and the slot its log-probability is
    added to (``slots``).
    """

    row_groups: list[list[Group]]
    width: int
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)
    branch: list[int] = field(default_factory=list)
    pred_index: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.row_groups)

    @property
    def tokens(self) -> int:
        """Padded tokens of the pass: what the budget counts."""
        return self.rows * self.width

    @property
    def plain(self) -> bool:
        """Every row holds one group of one branch: an ordinary causal mask will do."""
        return all(len(r) == 1 and len(r[0].branches) == 1 for r in self.row_groups)


def build_batch(row_groups: list[list[Group]], pad_id: int) -> PackedBatch:
    """The pass whose rows hold ``row_groups`` side by side, right-padded to the longest row."""
    width = max(sum(g.size for g in row) for row in row_groups)
    batch = PackedBatch(row_groups, width)
    ids, positions, segment, branch = batch.ids, batch.positions, batch.segment, batch.branch
    for row in row_groups:
        start = len(ids)
        for seg, g in enumerate(row):
            base = len(ids)
            p = len(g.prefix)
            ids.extend(g.prefix)
            positions.extend(range(p))
            segment.extend([seg] * p)
            branch.extend([0] * p)
            for j, br in enumerate(g.branches, start=1):
                at = len(ids)
                m = len(br.ids)
                ids.extend(br.ids)
                positions.extend(range(p, p + m))
                segment.extend([seg] * m)
                branch.extend([j] * m)
                # branch token t is predicted at t - 1, or by the prefix's last token for t == 0
                first = m - br.n
                batch.pred_index.append(at + first - 1 if first > 0 else base + p - 1)
                batch.pred_index.extend(range(at + first, at + m - 1))
                batch.targets.extend(br.ids[first:])
                batch.slots.extend([br.slot] * br.n)
        pad = width - (len(ids) - start)
        ids.extend([pad_id] * pad)
        positions.extend([0] * pad)
        segment.extend([-1] * pad)
        branch.extend([0] * pad)
    return batch


def plan_batches(groups: Sequence[Group], max_tokens: int, pad_id: int, pack: bool = True) -> list[PackedBatch]:
    """Cut ``groups`` into forward passes of at most ``max_tokens`` padded tokens, longest
    groups first, so each pass is as wide as its first group.

    With ``pack``, a group goes into the first row of the pass with room left (several
    groups per row); else each group has its own row.  A group longer than ``max_tokens``
    runs alone.
    """
    order = sorted(groups, key=lambda g: -g.size)
    batches: list[PackedBatch] = []
    i = 0
    while i < len(order):
        width = order[i].size
        row_cap = max(1, max_tokens // width)
        rows: list[list[Group]] = []
        room: list[int] = []
        while i < len(order):
            g = order[i]
            spot = next((r for r, left in enumerate(room) if left >= g.size), None) if pack else None
            if spot is None:
                if len(rows) >= row_cap:
                    break
                rows.append([])
                room.append(width)
                spot = len(rows) - 1
            rows[spot].append(g)
            room[spot] -= g.size
            i += 1
        batches.append(build_batch(rows, pad_id))
    return batches


def split_group(group: Group) -> list[Group]:
    """A group of several branches as one group per branch (each with the prefix): the last
    resort when one group does not fit in memory."""
    return [Group(group.prefix, (b,)) for b in group.branches]
