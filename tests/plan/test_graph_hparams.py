"""Every integer hyperparameter the compute graph reads is one the profile checks when it is built
(so a hostile value is refused with one clean error there, not a ValueError in the replay)."""

from __future__ import annotations

import re
from pathlib import Path

import moetune.plan.graph as graph
from moetune.model.profile import INT_HPARAMS


def test_the_graph_reads_only_checked_integers() -> None:
    src = Path(graph.__file__).read_text()
    read = set(re.findall(r'(?:g|self)\.hp\("([a-z_.]+)"', src)) | set(re.findall(r'hp_int\("([a-z_.]+)"', src))
    assert read, "the pattern no longer finds the graph's reads"
    assert read <= set(INT_HPARAMS), sorted(read - set(INT_HPARAMS))
