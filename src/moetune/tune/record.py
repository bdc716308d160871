"""A tune's sweep record (the ``sweeps.spec`` column of the history): what defines the search, and
the candidates that failed to launch with why, so that running the same command again resumes
without retrying them. One writer (:meth:`TuneRecord.to_json`, the stored shape) and one reader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

KIND = "tune"


def _obj(x: object) -> dict[str, object] | None:
    return {str(k): v for k, v in x.items()} if isinstance(x, Mapping) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneRecord:
    objective: str
    hw: str
    model: str
    workload: Mapping[str, object]  # moetune.bench.single.workloads.Workload.to_json()
    candidates: tuple[str, ...]  # their labels, the baseline first
    failed: Mapping[str, str] = field(default_factory=dict)  # label -> why its launch failed
    serve: Mapping[str, object] | None = None  # --objective goodput: ServeLoad.to_json()
    work: Mapping[str, object] | None = None  # replay:FILE or turn: WorkObjective.key()
    weighted: Mapping[str, object] | None = None  # weighted:...: Weighted.to_json()

    def to_json(self) -> dict[str, object]:
        return {
            "kind": KIND,
            "objective": self.objective,
            "hw": self.hw,
            "model": self.model,
            "workload": dict(self.workload),
            "candidates": list(self.candidates),
            "failed": dict(self.failed),
            "serve": None if self.serve is None else dict(self.serve),
            "work": None if self.work is None else dict(self.work),
            "weighted": None if self.weighted is None else dict(self.weighted),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> TuneRecord:
        """A stored record; a part missing or of another type reads as empty."""
        failed, cands = d.get("failed"), d.get("candidates")
        return cls(
            objective=str(d.get("objective") or ""),
            hw=str(d.get("hw") or ""),
            model=str(d.get("model") or ""),
            workload=_obj(d.get("workload")) or {},
            candidates=tuple(str(c) for c in cands) if isinstance(cands, list) else (),
            failed={str(k): str(v) for k, v in failed.items()} if isinstance(failed, Mapping) else {},
            serve=_obj(d.get("serve")),
            work=_obj(d.get("work")),
            weighted=_obj(d.get("weighted")),
        )
