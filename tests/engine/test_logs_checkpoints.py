"""Context checkpoints in both log eras, from real captures (tests/fixtures/logs, `hybrid_checkpoints`
in capture.py and capture_ik.py): what each grammar reads, what `doctor` makes of it, and the
ledger's size of one checkpoint against the sizes the engines logged for the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs import parse_log
from moetune.kinds import EngineKind, LogEra
from moetune.model.archs import Dims
from moetune.model.kv import checkpoint_bytes, kv_shape
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.run.doctor import Source, examine

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
MAINLINE = LOGS / "real_hybrid_checkpoints.mainline.log"
IK = LOGS / "real_ik_hybrid_checkpoints.legacy.log"
MIB = 1 << 20


@pytest.mark.parametrize(("path", "era"), [(MAINLINE, LogEra.MAINLINE), (IK, LogEra.LEGACY)])
def test_both_eras_read_checkpoints_restores_and_full_reprocessing(path: Path, era: LogEra) -> None:
    log = parse_log(path.read_text(errors="replace"))
    assert log.era == era
    assert len(log.checkpoints_created) >= 4 and all(c.slot == 0 or c.slot is not None for c in log.checkpoints_created)
    assert [c.index for c in log.checkpoints_created][:2] == [1, 2]
    (restore,) = log.checkpoint_restores
    assert restore.tokens_kept > 1000 and restore.size_mib > 0.25
    assert (restore.n_past is not None) == (era == LogEra.MAINLINE)  # ik does not say where it went on from
    assert len(log.full_reprocessing) == 1  # the third prompt diverges before every checkpoint
    # a prompt processed around a checkpoint logs its progress in several lines: one miss each, not
    # one per line; ik's second request is a miss too (a chat: the template closes the user turn,
    # which the extended prompt moves), the one its restore served
    assert len(log.cache_misses) == (1 if era == LogEra.MAINLINE else 2)


@pytest.mark.parametrize("path", [MAINLINE, IK])
def test_doctor_counts_restores_and_what_they_kept(path: Path) -> None:
    log = parse_log(path.read_text(errors="replace"))
    (f,) = [f for f in examine([Source(name=path.name, server=log)]) if f.code == "checkpoint_restores"]
    assert f.data["restores"] == 1 and f.data["full_reprocessing"] == 1
    assert f.data["tokens_kept"] == log.checkpoint_restores[0].tokens_kept
    assert "avoided as many full prompt re-processings" in f.title and "--ctx-checkpoints" in f.remedy
    most = max(c.index or 0 for c in log.checkpoints_created)  # one slot: the most it held at once
    assert most >= 3 and f.data["held_mib"] == pytest.approx(most * f.data["checkpoint_mib"], rel=1e-3)
    assert {e.line for e in f.evidence} >= {log.checkpoint_restores[0].line, log.full_reprocessing[0]}


def test_no_finding_without_checkpoints() -> None:
    log = parse_log((LOGS / "real_serve.mainline.log").read_text(errors="replace"))
    assert not log.checkpoints_created
    assert not [f for f in examine([Source(name="s", server=log)]) if f.code == "checkpoint_restores"]


def test_ledger_size_matches_both_engines_logs(tmp_path: Path) -> None:
    p = load_profile(
        generate(tmp_path / "h.gguf", "qwen35moe", Dims(n_layer=4, n_vocab=32000), "f16", sparse=True).files[0]
    )
    main = parse_log(MAINLINE.read_text(errors="replace"))
    want = checkpoint_bytes(kv_shape(p), EngineKind.MAINLINE) / MIB
    for c in (*main.checkpoints_created, *main.checkpoint_restores):
        assert c.size_mib == pytest.approx(want, rel=0.01)
    ik = parse_log(IK.read_text(errors="replace"))
    kv = kv_shape(p, EngineKind.IK)
    for c in ik.checkpoints_created:
        assert c.size_mib == pytest.approx(
            checkpoint_bytes(kv, EngineKind.IK, tokens_per_slot=c.pos_max + 1) / MIB, rel=0.01
        )
