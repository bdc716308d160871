"""Processes: launch a plan's RPC workers and servers in order, watch them, stop them in order,
and say why a launch failed (``diagnose``) or what a log shows (``doctor``).

    from moetune.run import launch, launched, read_plan, stop_run
    spec, doc = read_plan(Path("plan.json"))
    with launched(spec, doc) as ln:       # every server healthy; run directory in ln.run.path
        bench(ln.url)                     # ... stopped in order on leaving, Ctrl-C included
"""

from moetune.run.diagnose import Diagnosis
from moetune.run.launch import Event, Launched, launch, launched, supervise
from moetune.run.prepare import LaunchFailed, read_plan
from moetune.run.record import RunDir
from moetune.run.stop import stop_run, survivors

__all__ = [
    "Diagnosis",
    "Event",
    "LaunchFailed",
    "Launched",
    "RunDir",
    "launch",
    "launched",
    "read_plan",
    "stop_run",
    "supervise",
    "survivors",
]
