"""Bounds on one fuzz example: CPU time and memory, enforced while it runs, not measured after.

Hypothesis's ``deadline`` only reports a slow example once it has returned; a parser that loops
forever never returns. Here a CPU-time timer (``ITIMER_VIRTUAL``, so pytest-timeout's wall-clock
``SIGALRM`` stays untouched) raises :class:`Hang` inside the example, and the address space is
capped (``RLIMIT_AS``) a fixed margin above what the process holds, so an allocation sized by a
corrupt count (2^60 elements) fails as ``MemoryError`` at once instead of taking the machine.
The hang is a ``BaseException``, out of reach of the product's ``except Exception``; both become an
AssertionError once out of the body, so Hypothesis shrinks and reports the example like any failure.
"""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

CPU_S = 10.0  # a header, a YAML file or a log parses in milliseconds; ten seconds is a hang
MEMORY_MIB = 768  # above what the process holds when the example starts


class Hang(BaseException):
    """The example used more CPU time than its bound."""


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _hang(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"the example ran past its CPU-time bound of {CPU_S:g} s")


@contextmanager
def bounded(cpu_s: float = CPU_S, memory_mib: int = MEMORY_MIB) -> Iterator[None]:
    """Run the body under a CPU-time bound and an address-space bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + (memory_mib << 20)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    old = signal.signal(signal.SIGVTALRM, _hang)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_s)
    try:
        yield
    except Hang as e:  # an ordinary failure past this point: Hypothesis shrinks and shows the example
        raise AssertionError(str(e)) from None
    except MemoryError:
        raise AssertionError(f"the example allocated past its bound of {memory_mib} MiB") from None
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGVTALRM, old)
