"""The fuzzers' bounds hold: a loop that never ends and an allocation sized by a corrupt count both
stop the example (tests/fuzz/guard.py)."""

from __future__ import annotations

import pytest

from tests.fuzz.guard import Hang, bounded


def test_the_guard_stops_a_hang_and_an_allocation() -> None:
    with pytest.raises(Hang), bounded(cpu_s=0.3):
        while True:
            pass
    with pytest.raises(MemoryError), bounded():
        bytearray(1 << 34)
