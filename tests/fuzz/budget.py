"""The fuzzers' budget: the examples each test runs, per run length.

``make test`` runs the ``ci`` profile (a fixed number of examples per test, sized so that all of
tests/fuzz takes about a minute on two cores); ``make fuzz`` sets ``MOETUNE_FUZZ=long`` for ten
times as many. Every example also runs under :func:`tests.fuzz.guard.bounded` (CPU time and
memory); Hypothesis's ``deadline`` reports the slow ones that still end.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.control import currently_in_test_context

RUN = os.environ.get("MOETUNE_FUZZ", "ci")
if RUN not in ("ci", "long"):
    raise ValueError(f"MOETUNE_FUZZ={RUN!r}: expected ci or long")
FACTOR = 10 if RUN == "long" else 1


def fuzz(n: int) -> settings:
    """Settings for a fuzz test that runs ``n`` examples under ``make test``."""
    return settings(
        max_examples=n * FACTOR,
        deadline=15000,  # ms: a shared 2-core CI machine is slow (8 s seen under load); a hang is caught by the CPU-time bound
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
        # no explain phase: it traces every line, ten times slower, and the CPU-time bound would fire
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    )


def note_event(what: str) -> None:
    """An outcome for Hypothesis's statistics (``--hypothesis-show-statistics``), where a target runs
    inside a Hypothesis test (the corpus replays it outside one)."""
    if currently_in_test_context():
        event(what)
