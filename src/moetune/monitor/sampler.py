"""The sampler: a background thread that takes a :class:`~moetune.monitor.snapshot.Snapshot` of
the machine about once a second and hands it to a sink (the history, a launch's file, the
Prometheus endpoint's memory).

What it watches is given as a function returning :class:`Watch` entries, asked again at every tick,
so processes relaunched in the middle of a run (serve-bench ``--match-slots``) are followed. Local
processes are read from /proc; a process on another node (an RPC worker started over ssh) from one
long-lived ssh session per node that prints its /proc/PID/stat every second (no connection per
sample). A watched llama-server's own ``/metrics`` is scraped when it answers (moetune launches
servers with ``--metrics``); a server that answers 404/501 is not asked again, one that does not
answer yet (loading) is asked at the next tick.

The thread's own CPU time is measured (:attr:`Sampler.cpu_seconds`): the overhead a benchmark pays
for being watched, recorded by ``make bench`` (benchmarks/bench_sampler.py).
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune import contention, procfs
from moetune.engine import auth
from moetune.monitor.gpu import NvmlProbe, load_nvml
from moetune.monitor.snapshot import GpuSample, HostSample, ProcSample, Snapshot

DEFAULT_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 0.5


def interval_from_env() -> float:
    """Seconds between samples (``MOETUNE_METRICS_INTERVAL``; 0 turns sampling off)."""
    raw = os.environ.get("MOETUNE_METRICS_INTERVAL", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Watch:
    """One engine process to watch."""

    name: str
    role: str  # server | rpc
    node: str = "local"
    pid: int | None = None  # on its node
    start_ticks: int | None = None  # tells a reused pid from the process
    ssh: tuple[str, ...] | None = None  # the ssh client and options, for a process on another node
    ssh_target: str | None = None
    metrics_url: str | None = None  # a server's /metrics
    # this machine's processes of it, besides ``pid``: a container's `podman run` client, a remote
    # worker's ssh client (the engine's side of the CPU accounting, :mod:`moetune.contention`)
    local_pids: tuple[int, ...] = ()

    @property
    def remote(self) -> bool:
        return self.ssh_target is not None

    @property
    def engine_roots(self) -> tuple[int, ...]:
        """Its processes on this machine (their descendants count as the engine's too)."""
        return (*((self.pid,) if self.pid is not None and not self.remote else ()), *self.local_pids)


def watches_of_launch(launch_run: str) -> list[Watch]:
    """The processes of a launch (its run directory's records; in a container, its main process)."""
    from moetune.run.record import RunDir

    try:
        procs = RunDir.open(launch_run).procs()
    except Exception:  # a launch being written or removed: nothing to watch this tick
        return []
    return [
        Watch(
            name=r.name,
            role=str(r.role),
            node=r.node,
            pid=r.engine_pid[0],
            start_ticks=r.engine_pid[1],
            ssh=tuple(r.ssh) if r.ssh else None,
            ssh_target=r.ssh_target,
            metrics_url=f"{r.url}/metrics" if str(r.role) == "server" else None,
            local_pids=tuple(p for p in (r.pid, r.container_pid) if p is not None),
        )
        for r in procs
        if r.engine_pid[0] is not None and r.exited_at is None
    ]


def watches_for_url(url: str) -> Callable[[], list[Watch]]:
    """What to watch for a benchmark of a running server: the live launch that serves ``url``
    (its workers too), else the local process listening on its port; the answer is looked up once,
    then followed."""
    from urllib.parse import urlsplit

    from moetune.run.status import runs

    parts = urlsplit(url)
    found: list[Watch] | None = None
    launch: str | None = None
    for s in runs():
        if any(u.rstrip("/") == url.rstrip("/") for u in s.urls.values()):
            launch = s.run
    if launch is None and parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port:
        pid = procfs.listening_pid(parts.port)
        st = procfs.read_proc_stat(pid) if pid else None
        found = (
            []
            if pid is None
            else [
                Watch(
                    name="server",
                    role="server",
                    pid=pid,
                    start_ticks=st.start_ticks if st else None,
                    metrics_url=f"{url.rstrip('/')}/metrics",
                )
            ]
        )

    def get() -> list[Watch]:
        return watches_of_launch(launch) if launch is not None else list(found or [])

    return get


class _NodeStream:
    """One ssh session to a node printing ``PID <stat line>`` for the watched pids every interval."""

    def __init__(self, ssh: Sequence[str], target: str, pids: Sequence[int], interval_s: float) -> None:
        from moetune.run.remote import ssh_argv

        self.pids = tuple(sorted(pids))
        each = " ".join(str(p) for p in self.pids)
        script = (
            f'while :; do for p in {each}; do echo "$p $(cat /proc/$p/stat 2>/dev/null)"; done; '
            f"sleep {interval_s:g}; done"
        )
        self.latest: dict[int, tuple[float, procfs.ProcStat | None]] = {}
        # its own process group, ended as a whole (the node's side ends at its next write: SIGPIPE)
        self.proc = subprocess.Popen(
            ssh_argv(ssh, target, script),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.thread = threading.Thread(target=self._read, name=f"moetune-sampler-{target}", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            pid, _, stat = line.strip().partition(" ")
            if pid.isdigit():
                self.latest[int(pid)] = (time.monotonic(), procfs.parse_proc_stat(stat) if stat else None)

    def close(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class NoMetrics(Exception):
    """The server answers, but has no /metrics (started without --metrics, or not llama-server)."""


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> dict[str, float] | None:
    """A server's ``/metrics`` as numbers by series name; None while it does not answer (still
    loading, or gone); :class:`NoMetrics` when it answers without them."""
    from moetune.monitor.exposition import parse_text

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth.headers(url)), timeout=timeout_s) as r:
            return parse_text(r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        if e.code in (404, 501):
            raise NoMetrics(url) from None
        return None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class Sampler:
    """Samples every ``interval_s`` in a daemon thread between :meth:`start` and :meth:`stop`.

    ``watches`` says what to watch (asked at every tick), ``sink`` receives each snapshot (called in
    the sampler's thread; it must not block for long), ``load`` says what the benchmark is doing
    (requests in flight, done, errors), and :attr:`phase` is stamped on each snapshot."""

    def __init__(
        self,
        sink: Callable[[Snapshot], None] | None = None,
        *,
        watches: Callable[[], list[Watch]] = list,
        load: Callable[[], Mapping[str, float]] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        gpus: NvmlProbe | bool | None = True,
        scraper: Callable[[str], dict[str, float] | None] = scrape,
        host: bool = True,
        census: bool = False,
    ) -> None:
        self.sink = sink
        self.watches = watches
        self.load = load
        self.interval_s = interval_s
        self.phase: str | None = None
        self.latest: Snapshot | None = None
        self.count = 0
        self.cpu_seconds = 0.0  # the sampler thread's own CPU time
        self.errors: list[str] = []
        self._gpus: NvmlProbe | None = gpus if isinstance(gpus, NvmlProbe) else None
        self._want_gpus = gpus is True
        self._scraper = scraper
        self._read_host = host
        self._no_metrics: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: tuple[procfs.CpuTimes, ...] | None = None
        self._procs: dict[tuple[str, int], tuple[float, procfs.ProcStat | None]] = {}
        self._streams: dict[tuple[str, tuple[str, ...]], _NodeStream] = {}
        # the CPU accounting (moetune.contention): a census of every process at each tick, the
        # intervals added to ``tally`` while one is set (a run measuring)
        self._census = census
        self._census_lock = threading.Lock()
        self._last_census: contention.Census | None = None
        # the last few readings (about a second apart), to judge a short run over seconds
        self.recent_censuses: collections.deque[contention.Census] = collections.deque(maxlen=8)
        self.tally: contention.Tally | None = None

    # -- life ------------------------------------------------------------------------------
    def start(self) -> Sampler:
        if self._thread is None and self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="moetune-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after one last sample (so a short run still gets its end)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
        self.close()

    def close(self) -> None:
        """End the ssh sessions to other nodes (a sampler ticked by hand, without its thread, too)."""
        for s in self._streams.values():
            s.close()
        self._streams.clear()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while True:
            c0 = time.thread_time()
            try:
                self.tick()
            except Exception as e:  # a sampler never takes a benchmark down
                if len(self.errors) < 10:
                    self.errors.append(f"{type(e).__name__}: {e}")
            self.cpu_seconds += time.thread_time() - c0
            next_at += self.interval_s
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                with contextlib.suppress(Exception):
                    self.tick()
                return

    # -- one sample ------------------------------------------------------------------------
    def tick(self) -> Snapshot:
        """Take one snapshot now, hand it to the sink, keep it as :attr:`latest`."""
        if self._want_gpus:  # NVML is opened by the first sample, in the sampler's thread
            self._want_gpus = False
            nvml = load_nvml()
            self._gpus = NvmlProbe(nvml) if nvml is not None else None
        now = time.monotonic()
        watches = self.watches()  # asked once a tick: a launch's records are files
        if self._census:
            self.count_cpu(watches)
        snap = Snapshot(
            t=time.time(),
            host=self._host() if self._read_host else HostSample(),
            procs=self._proc_samples(now, watches),
            gpus=self._gpu_samples(),
            servers=self._servers(watches),
            load=dict(self.load()) if self.load else {},
            phase=self.phase,
        )
        self.latest = snap
        self.count += 1
        if self.sink is not None:
            self.sink(snap)
        return snap

    def count_cpu(self, watches: list[Watch] | None = None) -> None:
        """Read every process's CPU time now and add the interval since the last reading to
        :attr:`tally` (when one is set): the engine's (``watches``), moetune's own, the rest."""
        with self._census_lock:
            now = contention.census()
            prev, self._last_census = self._last_census, now
            self.recent_censuses.append(now)
            if prev is None or self.tally is None:
                return
            self.tally.add(self.split(prev, now, watches))

    def split(
        self, before: contention.Census, after: contention.Census, watches: list[Watch] | None = None
    ) -> contention.Split:
        """Where the CPU went between two readings: the engine's (``watches``), moetune's, the rest."""
        ws = self.watches() if watches is None else watches
        engine = {p for w in ws for p in w.engine_roots}
        client = {os.getpid(), *(s.proc.pid for s in self._streams.values())}
        return contention.split(before, after, engine, client)

    def _host(self) -> HostSample:
        cpu = procfs.read_cpu_times()
        busy = procfs.cpu_busy_pct(self._cpu, cpu) if self._cpu is not None else None
        self._cpu = cpu
        mem = procfs.read_meminfo()
        total = mem.get("MemTotal")
        avail = mem.get("MemAvailable")
        return HostSample(
            cpu_pct=busy,
            mem_total_bytes=total,
            mem_used_bytes=None if total is None or avail is None else total - avail,
            mlocked_bytes=mem.get("Mlocked"),
            load1=procfs.read_load1(),
        )

    def _gpu_samples(self) -> tuple[GpuSample, ...]:
        return self._gpus.sample() if self._gpus is not None else ()

    def _proc_samples(self, now: float, watched: list[Watch]) -> tuple[ProcSample, ...]:
        watches = [w for w in watched if w.pid is not None]
        self._follow_remote(watches)
        gpu_mem = self._gpus.process_memory() if self._gpus is not None else {}
        out = []
        for w in watches:
            assert w.pid is not None
            key = (w.node, w.pid)
            if w.remote:
                seen = self._streams.get((w.ssh_target or "", w.ssh or ()))
                at, st = seen.latest.get(w.pid, (now, None)) if seen else (now, None)
            else:
                at, st = now, procfs.read_proc_stat(w.pid)
            if st is not None and w.start_ticks is not None and st.start_ticks != w.start_ticks:
                st = None  # the pid was reused: not our process
            prev = self._procs.get(key)
            self._procs[key] = (at, st)
            alive = st is not None and st.state not in ("Z", "X")
            cpu = procfs.proc_cpu_pct(prev[1], st, at - prev[0]) if prev is not None and at > prev[0] else None
            out.append(
                ProcSample(
                    name=w.name,
                    role=w.role,
                    node=w.node,
                    pid=w.pid,
                    cpu_pct=cpu if alive else None,
                    rss_bytes=st.rss_pages * procfs.PAGE_SIZE if st and alive else None,
                    threads=st.threads if st and alive else None,
                    minflt=st.minflt if st else None,
                    majflt=st.majflt if st else None,
                    gpu_mem_bytes=gpu_mem.get(w.pid) if not w.remote else None,
                    alive=alive,
                )
            )
        return tuple(out)

    def _follow_remote(self, watches: list[Watch]) -> None:
        """One ssh stream per node for its watched pids; restarted when the set of pids changes."""
        want: dict[tuple[str, tuple[str, ...]], set[int]] = {}
        for w in watches:
            if w.remote and w.pid is not None:
                want.setdefault((w.ssh_target or "", w.ssh or ()), set()).add(w.pid)
        for key in list(self._streams):
            if key not in want or set(self._streams[key].pids) != want[key]:
                self._streams.pop(key).close()
        for key, pids in want.items():
            if key not in self._streams:
                self._streams[key] = _NodeStream(key[1], key[0], sorted(pids), self.interval_s)

    def _servers(self, watches: list[Watch]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for w in watches:
            url = w.metrics_url
            if url is None or url in self._no_metrics:
                continue
            try:
                got = self._scraper(url)
            except NoMetrics:
                self._no_metrics.add(url)  # not asked again
                continue
            if got is not None:
                out[w.name] = got
        return out


class RunSink:
    """Where a run's snapshots go: held in memory until the run exists in the history (a plan's
    server is sampled while it loads, before the run row is created), then written as they come."""

    def __init__(self) -> None:
        self._held: list[Snapshot] = []
        self._write: Callable[[Snapshot], None] | None = None
        self._lock = threading.Lock()

    def __call__(self, snap: Snapshot) -> None:
        with self._lock:
            if self._write is None:
                self._held.append(snap)
            else:
                self._write(snap)

    def attach(self, db: Any, run_id: int) -> None:
        """From now on, into ``db`` (a ResultsDB) under ``run_id``; what was held first."""

        def write(s: Snapshot) -> None:
            db.add_metrics(run_id, s.t, s.to_json())

        with self._lock:
            for s in self._held:
                write(s)
            self._held.clear()
            self._write = write


class LaunchSink:
    """A launch's snapshots, one JSON line each, in its run directory (``metrics.jsonl``); held until
    the launcher has created the directory."""

    FILE = "metrics.jsonl"

    def __init__(self, launch_id: str) -> None:
        self.launch_id = launch_id
        self._held: list[Snapshot] = []

    def __call__(self, snap: Snapshot) -> None:
        import json

        from moetune.paths import runs_dir

        d = runs_dir() / self.launch_id
        self._held.append(snap)
        if not (d / "run.json").exists():
            return
        with open(d / self.FILE, "a") as f:
            for s in self._held:
                f.write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")
        self._held.clear()


class RunMonitor:
    """A run's sampler and its sink: started before the run exists (while its server loads), attached
    to it once created, stopped when it ends. Phases name what the benchmark is doing."""

    def __init__(
        self,
        watches: Callable[[], list[Watch]],
        *,
        load: Callable[[], Mapping[str, float]] | None = None,
        interval_s: float | None = None,
        phase: str | None = None,
        on_snapshot: Callable[[Snapshot], None] | None = None,
    ) -> None:
        contention.max_foreign_cores(1)  # a bad MOETUNE_MAX_FOREIGN_CORES is told before anything starts
        self._run: tuple[Any, int] | None = None  # (db, run id) once attached, until close stores its contention
        self.counted: contention.Contention | None = None  # what close stored
        self._before: tuple[contention.Census, ...] = ()  # the readings up to attach
        self.sink = RunSink()
        self.on_snapshot = on_snapshot
        self.sampler = Sampler(
            self._take,
            watches=watches,
            load=load,
            interval_s=interval_from_env() if interval_s is None else interval_s,
            census=True,
        )
        self.sampler.phase = phase

    def _take(self, snap: Snapshot) -> None:
        self.sink(snap)
        if self.on_snapshot is not None:
            self.on_snapshot(snap)

    def __enter__(self) -> RunMonitor:
        self.sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop sampling (a last sample first) and store where the CPU went while the run measured
        (:meth:`cpu_contention`); again is a no-op."""
        run, self._run = self._run, None
        counted = None
        if run is not None:
            try:
                counted = self.cpu_contention()
            except Exception as e:  # an accounting that fails never takes the run down
                self.sampler.errors.append(f"contention: {type(e).__name__}: {e}")
        self.sampler.stop()
        if run is not None and counted is not None:
            run[0].set_contention(run[1], counted)
            self.counted = counted

    def attach(self, db: Any, run_id: int) -> None:
        """The run exists: its snapshots go to it, and its CPU accounting starts now (stored with it
        by :meth:`close`)."""
        self.sink.attach(db, run_id)
        self.sampler.count_cpu()  # the reading the run's first interval starts from
        self._before = tuple(self.sampler.recent_censuses)  # the readings before it, the last that one
        self.sampler.tally = contention.Tally()
        self._run = (db, run_id)

    def cpu_contention(self) -> contention.Contention | None:
        """Where the CPU went since :meth:`attach` (a last reading now), judged by the threshold.
        A run shorter than :data:`contention.MIN_JUDGED_S` is judged over that span: the readings
        before attach (:func:`contention.lead`), and where those do not reach back far enough (a
        server up in under a second) the seconds after the run, waited for here, the engine idle
        (not where nothing would be judged: the threshold off, no engine seen). None before attach."""
        tally = self.sampler.tally
        if tally is None:
            return None
        self.sampler.count_cpu()
        need = contention.MIN_JUDGED_S - tally.seconds
        lead = contention.lead(self._before, need)
        short = need - (self._before[-1].t - lead.t if lead is not None else 0.0)
        if short > 0 and tally.engine_seen and contention.max_foreign_cores(tally.cores) is not None:
            time.sleep(short)
            self.sampler.count_cpu()
        judged = tally
        if lead is not None:
            judged = tally.copy()
            judged.add(self.sampler.split(lead, self._before[-1]))
        return judged.result(contention.max_foreign_cores(judged.cores))

    def phase(self, name: str | None) -> None:
        self.sampler.phase = name
