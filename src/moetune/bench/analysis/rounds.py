"""Rounds of an interleaved sweep: the order plans run in, the tag each run records, and which runs
form a complete round. Pure functions over small records; the sweep (:mod:`moetune.bench.single.
interleave`) writes the tags, ``compare`` reads them.

A round is one run of every plan. Round 1 runs the plans in their order (A B), round 2 in reverse
(B A), and so on, so a steady drift of the machine favours each plan equally often. A round is
complete when every plan has a completed run in one *attempt* at it: a round interrupted half-way
is run again whole, never finished later with the missing plan alone, since a run made an hour
after its partner is no longer paired with it. The earlier attempt's runs stay in the history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError
from moetune.kinds import RunStatus

if TYPE_CHECKING:
    from moetune.store.db import Run

LAUNCHES, BATCHES = "launches", "batches"
MODES = (LAUNCHES, BATCHES)
DETAILS_KEY = "sweep"  # where a run's RunMeta.details holds its RoundTag


def round_order(labels: Sequence[str], round_no: int) -> list[str]:
    """The plans' order in round ``round_no`` (1-based): as given in odd rounds, reversed in even ones."""
    return list(labels) if round_no % 2 == 1 else list(reversed(labels))


def schedule(labels: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """Every (round, label) in the order an interleaved sweep runs them."""
    return [(r, label) for r in range(1, rounds + 1) for label in round_order(labels, r)]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTag:
    """What a run of an interleaved sweep records in its details (under ``"sweep"``)."""

    sweep: str
    round: int  # 1-based
    attempt: str  # one token per attempt at the round, shared by its runs
    mode: str  # launches | batches
    position: int  # 0-based place in the round's order

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.sweep,
            "round": self.round,
            "attempt": self.attempt,
            "mode": self.mode,
            "position": self.position,
        }

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> RoundTag | None:
        d = details.get(DETAILS_KEY)
        if not isinstance(d, Mapping) or not isinstance(d.get("round"), int):
            return None
        return cls(
            sweep=str(d.get("id") or ""),
            round=int(d["round"]),
            attempt=str(d.get("attempt") or ""),
            mode=str(d.get("mode") or ""),
            position=int(d.get("position") or 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaggedRun:
    """A run as pairing sees it."""

    run: int
    label: str
    round: int
    attempt: str
    done: bool


def tagged_runs(runs: Iterable[Run]) -> list[TaggedRun]:
    """The runs that carry a round tag, as pairing sees them."""
    out = []
    for r in runs:
        tag = RoundTag.from_details(r.meta.details)
        if tag is not None:
            out.append(
                TaggedRun(
                    run=r.id, label=r.label, round=tag.round, attempt=tag.attempt, done=r.status == RunStatus.DONE
                )
            )
    return out


def complete_rounds(runs: Sequence[TaggedRun], labels: Sequence[str]) -> dict[int, dict[str, int]]:
    """``{round: {label: run}}`` for every round whose plans all completed in one attempt (the
    newest such attempt when there are several), rounds in order."""
    need = set(labels)
    by_attempt: dict[tuple[int, str], dict[str, int]] = {}
    newest: dict[tuple[int, str], int] = {}
    for r in runs:
        if r.label not in need:
            continue
        key = (r.round, r.attempt)
        newest[key] = max(newest.get(key, r.run), r.run)
        if r.done:
            got = by_attempt.setdefault(key, {})
            got[r.label] = max(got.get(r.label, r.run), r.run)
    out: dict[int, tuple[int, dict[str, int]]] = {}
    for (rnd, attempt), got in by_attempt.items():
        if set(got) == need and (rnd not in out or newest[(rnd, attempt)] > out[rnd][0]):
            out[rnd] = (newest[(rnd, attempt)], got)
    return {rnd: {label: out[rnd][1][label] for label in labels} for rnd in sorted(out)}


def rounds_by_order(runs: Sequence[tuple[int, str]], labels: Sequence[str]) -> dict[int, dict[str, int]]:
    """Runs a user alternated by hand (``compare --paired``): the k-th run of each label, by id,
    forms round k. Every label needs the same number of runs."""
    groups: dict[str, list[int]] = {label: [] for label in labels}
    for run, label in runs:
        if label not in groups:
            raise InputError(f"run {run} ({label}) is none of the compared configurations ({', '.join(labels)})")
        groups[label].append(run)
    counts = {label: len(ids) for label, ids in groups.items()}
    if len(set(counts.values())) != 1 or min(counts.values()) == 0:
        raise InputError(
            "paired runs come in rounds: every configuration needs the same number of runs, got "
            + ", ".join(f"{label} {n}" for label, n in counts.items()),
            hint="name the runs of each round (ids), or the labels of runs made in alternation",
        )
    for ids in groups.values():
        ids.sort()
    n = next(iter(counts.values()))
    return {k + 1: {label: groups[label][k] for label in labels} for k in range(n)}
