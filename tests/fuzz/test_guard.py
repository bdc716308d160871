"""The fuzzers' bounds hold: a loop that never ends and an allocation sized by a corrupt count both
stop the example (tests/fuzz/guard.py)."""

from __future__ import annotations

import pytest

from tests.fuzz.guard import bounded


def test_the_guard_stops_a_hang_and_an_allocation() -> None:
    with pytest.raises(AssertionError, match="CPU-time bound"), bounded(cpu_s=0.3):
        while True:
            pass
    with pytest.raises(AssertionError, match="allocated past"), bounded():
        bytearray(1 << 34)
