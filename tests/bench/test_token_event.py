"""The raw stream events a sample stores as lists, read by their one reader (`token_event`)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from moetune.bench.analysis.serve import TokenEvent, event_times, token_event


@pytest.mark.parametrize(
    ("stored", "want"),
    [
        # an older run's event: no server clock, no earliest time
        ([10.5, 2, 7, 0], TokenEvent(t=10.5, tokens=2, content=7, reasoning=0)),
        ([10.5, 1, 0, 3, 41.0], TokenEvent(t=10.5, tokens=1, content=0, reasoning=3, server_ms=41.0)),
        ([10.5, 1, 4, 0, None, 10.25], TokenEvent(t=10.5, tokens=1, content=4, reasoning=0, earliest=10.25)),
        ([10.5, 1, 4, 0, math.nan, "x"], TokenEvent(t=10.5, tokens=1, content=4, reasoning=0)),  # not numbers: None
    ],
)
def test_a_stored_event_reads_by_name(stored: list[Any], want: TokenEvent) -> None:
    assert token_event(stored) == want


def test_events_read_together_are_spread_by_the_server_clock() -> None:
    # three events from one read at 10.3 (earliest 10.1), the server's clock 0, 50, 100 ms apart
    evs = [token_event([10.3, 1, 1, 0, ms, 10.1]) for ms in (0.0, 50.0, 100.0)]
    assert event_times(evs) == pytest.approx([10.2, 10.25, 10.3])
    evs = [token_event([10.3, 1, 1, 0, None, 10.0])] * 3  # no server clock: evenly
    assert event_times(evs) == pytest.approx([10.1, 10.2, 10.3])
