"""Why a launch failed, in one line, and what to change. Pure functions: logs and facts in,
a :class:`Diagnosis` out.

The out-of-memory advice is the one users work out by hand: a compute buffer that does not fit
shrinks about linearly with ``-ub``; or the experts of N layers leave the device, N from the
shortfall and the bytes of each layer's experts on it (from the plan, else from the model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from moetune.engine.logs import Evidence, ServerLog, WorkerLog, device_key
from moetune.engine.logs.types import (
    ABORTED,
    BAD_ARGUMENT,
    BIND_FAILED,
    COMPUTE,
    MODEL_LOAD_FAILED,
    MODEL_OPEN_FAILED,
    RPC_CONNECT_FAILED,
    RPC_CRASHED,
    RPC_PROTOCOL,
    SPLIT_DEVICES,
    AllocFailure,
)
from moetune.kinds import LogPhase

OUT_OF_MEMORY = "out_of_memory"
PORT_IN_USE = "port_in_use"
BINARY_MISSING = "binary_missing"
MODEL_MISSING = "model_missing"
SPLIT_MODE_DEVICES = "split_mode_devices"
RPC_UNREACHABLE = "rpc_unreachable"
RPC_LOST = "rpc_worker_lost"
BAD_ARGS = "bad_argument"
EXITED_DURING_LOAD = "exited_during_load"
EXITED = "exited"
NOT_HEALTHY = "not_healthy"
SSH_FAILED = "ssh_failed"
REPACK_CRASH = "repack_crash"
RPC_STALE = "rpc_worker_stale"
RPC_HANDSHAKE = "rpc_handshake"
REPACK_BUFFERS = ("CPU_REPACK", "AMX")  # mainline's extra CPU buffers of repacked weights
CRASH_CODES = (139, -11)  # SIGSEGV: a shell's 128 + 11, a Popen's -11
ABORT_CODES = (134, -6)  # SIGABRT
RPC_CONNECT_FRAME = "add_rpc_devices"  # ik_llama.cpp connects its --rpc workers while parsing its arguments
SCHED_ASSERT = "cur_backend_id != -1"  # the scheduler's assert with repacked F16 weights (DESIGN.md section 5)

HOST_DEVICES = ("CPU", "Host")  # memory moetune cannot move experts off (only to)
MIN_UBATCH = 32  # below this the GPU no longer takes over CPU-resident expert matmuls for prefill


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    cause: str
    process: str
    message: str  # what failed, one line
    hint: str  # what to change
    evidence: tuple[Evidence, ...] = ()

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["evidence"] = [{"line": e.line, "text": e.text} for e in self.evidence]
        return d


@dataclass(frozen=True, slots=True)
class LayerExperts:
    """The expert tensors of one layer on one device (from the plan, or the model when uniform)."""

    layer: int
    device: str
    expert_mib: float


# -- advice: pure arithmetic ----------------------------------------------------------------


def layers_to_offload(shortfall_mib: float, layers: Sequence[LayerExperts], device: str) -> tuple[int, ...] | None:
    """Fewest layers on ``device`` whose experts, moved off, free ``shortfall_mib`` (largest first;
    among equals the last layers, as llama.cpp's --fit leaves the tail on the CPU)."""
    mine = sorted(
        (x for x in layers if device_key(x.device) == device_key(device) and x.expert_mib > 0),
        key=lambda x: (-x.expert_mib, -x.layer),
    )
    freed, chosen = 0.0, []
    for x in mine:
        if freed >= shortfall_mib:
            break
        freed += x.expert_mib
        chosen.append(x.layer)
    return tuple(sorted(chosen)) if chosen and freed >= shortfall_mib else None


def uniform_layers_to_offload(shortfall_mib: float, per_layer_mib: float, n_layers: int) -> int | None:
    """Layers to move when every layer's experts weigh the same and the placement is unknown;
    None when even all ``n_layers`` MoE layers would not free enough."""
    if per_layer_mib <= 0 or shortfall_mib <= 0:
        return None
    n = max(1, math.ceil(shortfall_mib / per_layer_mib))
    return n if n <= n_layers else None


def lower_ubatch(n_ubatch: int, compute_mib: float, room_mib: float | None) -> int | None:
    """The largest power-of-two ``-ub`` below ``n_ubatch`` whose compute buffer, scaled linearly
    from ``compute_mib``, fits in ``room_mib`` (unknown room: half the current one)."""
    if n_ubatch <= MIN_UBATCH or compute_mib <= 0:
        return None
    target = n_ubatch / 2 if room_mib is None else n_ubatch * room_mib / compute_mib
    ub = 1 << max(math.floor(math.log2(max(target, 1))), 0)
    ub = min(ub, n_ubatch // 2)
    return ub if ub >= MIN_UBATCH else None


# -- diagnoses ------------------------------------------------------------------------------


def _ev(log: ServerLog | WorkerLog, lines: Sequence[int]) -> tuple[Evidence, ...]:
    return tuple(log.evidence(n) for n in sorted(set(lines)) if 0 < n <= len(log.lines))


def out_of_memory(
    name: str,
    log: ServerLog,
    failure: AllocFailure,
    layers: Sequence[LayerExperts],
    *,
    uniform: tuple[float, int] | None,
    n_ubatch: int | None = None,
) -> Diagnosis:
    """``layers``: the plan's expert placement; ``uniform``: (MiB per MoE layer, MoE layers) of the
    model, for when there is no placement; ``n_ubatch``: the -ub the process was given, where the
    log does not say."""
    dev = device_key(failure.device)
    kind = {COMPUTE: "compute buffer", "kv": "KV cache", "model": "model weights", "output": "output buffer"}.get(
        failure.what, "buffer"
    )
    size = failure.size_mib
    info = log.device(dev)
    free = info.free_mib if info else None
    held = log.device_buffers()
    already = sum(b.total_mib for k, b in held.items() if device_key(k) == dev)
    room = None if free is None else max(free - already, 0.0)
    said = f"{size:.0f} MiB" if size is not None else "size not logged"
    where = f"; {dev} has {free:.0f} MiB free" if free is not None else ""
    message = f"{name}: out of memory allocating the {dev} {kind} ({said}{where})"
    advice: list[str] = []
    ub = log.context.n_ubatch or n_ubatch
    if failure.what == COMPUTE and size is not None and ub:
        new_ub = lower_ubatch(ub, size, room)
        if new_ub:
            advice.append(f"lower -ub from {ub} to {new_ub} (the compute buffer shrinks about linearly with it)")
    if size is not None and dev not in HOST_DEVICES and not dev.endswith("_Host"):
        shortfall = size - room if room is not None else size
        chosen = layers_to_offload(shortfall, layers, dev) if layers else None
        if chosen:
            advice.append(f"move the experts of {len(chosen)} layer(s) off {dev} (blk {', '.join(map(str, chosen))})")
        elif uniform:
            n = uniform_layers_to_offload(shortfall, *uniform)
            if n:
                advice.append(f"move the experts of {n} layer(s) off {dev} ({uniform[0]:.0f} MiB each)")
    if not advice:
        advice.append("lower -ub or -c" if dev in HOST_DEVICES else f"put less on {dev}")
    hint = "; or ".join(advice) + "; `moetune plan` sizes the compute buffer before launching"
    lines = [failure.line, *(e.line for e in log.errors if e.line >= failure.line)][:6]
    return Diagnosis(cause=OUT_OF_MEMORY, process=name, message=message, hint=hint, evidence=_ev(log, lines))


# failures whose diagnosis is one sentence about the failing line's subject, and one remedy
_PLAIN_FAILURES = (
    (
        MODEL_OPEN_FAILED,
        MODEL_MISSING,
        "cannot open the model file {subject}",
        "check the -m path in the plan (and that every shard of a split model is there)",
    ),
    (
        BIND_FAILED,
        PORT_IN_USE,
        "could not listen on {subject}: the port is in use",
        "stop what holds the port (`moetune ps`), or give the process another port",
    ),
    (
        SPLIT_DEVICES,
        SPLIT_MODE_DEVICES,
        "split mode '{subject}' needs two or more devices",
        "drop -sm {subject} (layer split is the default), or give the server a second GPU",
    ),
)


def repack_evidence(log: ServerLog) -> list[int]:
    """The lines that say the server put weights in a repack buffer (none: it repacked nothing)."""
    return [b.line for b in log.buffers if b.kind == "model" and b.device in REPACK_BUFFERS]


def crashed_repacking(log: ServerLog, exit_code: int | None, *, loading: bool) -> bool:
    """The engine died at load with repacked weights: a segmentation fault (or the scheduler's
    assert) after logging a repack buffer, and no other failure that says why. ``exit_code`` None
    (a log file alone): the log just ends while loading, after the repack buffer."""
    if not loading or not repack_evidence(log) or log.alloc_failures:
        return False
    others = [f for f in log.failures if not (f.kind == ABORTED and SCHED_ASSERT in (f.subject or ""))]
    if others:
        return False
    if any(f.kind == ABORTED for f in log.failures):
        return True
    return exit_code in CRASH_CODES if exit_code is not None else not log.errors


def repack_crash(name: str, log: ServerLog, exit_code: int | None) -> Diagnosis:
    code = (
        ""
        if exit_code is None
        else f" (exit {exit_code}{', a segmentation fault' if exit_code in CRASH_CODES else ''})"
    )
    lines = repack_evidence(log)
    aborted = [f.line for f in log.failures if f.kind == ABORTED]
    return Diagnosis(
        cause=REPACK_CRASH,
        process=name,
        message=f"{name}: the engine crashed at load with repacked CPU weights{code}: its CPU's repacking "
        f"(the {'/'.join(sorted({b.device for b in log.buffers if b.line in lines}))} buffer) fails "
        "on this machine",
        hint="plan with --repack off (mainline's -nr; MOETUNE_REPACK=off for every plan): the weights stay "
        "in the mapped file, at some CPU speed",
        evidence=_ev(log, [*lines, *aborted, len(log.lines)]),
    )


def crashed_connecting(log: ServerLog, exit_code: int | None, *, loading: bool, outside: Sequence[str]) -> bool:
    """The server crashed (a segmentation fault or an abort) before its log said anything, or in
    the RPC connect of an abort's backtrace, and it uses RPC workers this run did not start
    (``outside``). ``exit_code`` None (a log file alone): not told."""
    if not loading or not outside or exit_code not in (*CRASH_CODES, *ABORT_CODES) or log.alloc_failures:
        return False
    if any(f.kind != ABORTED for f in log.failures):
        return False
    return not any(x.strip() for x in log.lines) or any(RPC_CONNECT_FRAME in x for x in log.lines)


def stale_worker(name: str, log: ServerLog, exit_code: int | None, outside: Sequence[str]) -> Diagnosis:
    signal = "a segmentation fault" if exit_code in CRASH_CODES else "an abort"
    where = ", ".join(outside)
    said = [i + 1 for i, x in enumerate(log.lines) if RPC_CONNECT_FRAME in x]
    return Diagnosis(
        cause=RPC_STALE,
        process=name,
        message=f"{name}: crashed connecting to its RPC worker{'s' if len(outside) > 1 else ''} {where} (exit "
        f"{exit_code}, {signal}{', before printing a line' if not said else ''}): a worker this run did not "
        "start, whose earlier client was killed while loading, can break every client after it (seen with "
        "ik_llama.cpp's rpc-server, after 10 to 32 such clients)",
        hint=f"restart the rpc-server at {where}, then launch again; the worker of a node with `ssh` in the "
        "hardware file is started by `launch`, a fresh one at every launch",
        evidence=_ev(log, said),
    )


def rpc_handshake(
    name: str,
    log: ServerLog,
    line: int,
    exit_code: int | None,
    endpoints: Sequence[str],
    workers: Mapping[str, WorkerLog],
) -> Diagnosis:
    """The client lost its workers' connection before the model loaded: at the handshake.
    ``workers``: the logs of those this run started, by endpoint (a refusal names its protocol)."""
    refusals = [(ep, w, f) for ep, w in workers.items() for f in w.failures if f.kind == RPC_PROTOCOL]
    where = ", ".join(endpoints) or "?"
    code = "" if exit_code is None else f" (exit {exit_code})"
    if refusals:
        ep, w, f = refusals[0]
        which = "the worker" if len(endpoints) == 1 else f"the worker at {ep}"
        said = f": {which}{f' (rpc-server v{w.version})' if w.version else ''} said {f.subject!r}"
    else:
        said = ": it speaks another RPC protocol than this server's build, or is not an rpc-server"
    return Diagnosis(
        cause=RPC_HANDSHAKE,
        process=name,
        message=f"{name}: its RPC worker{'s' if len(endpoints) > 1 else ''} {where} dropped the connection at "
        f"the handshake, before the model loaded{code}{said}",
        hint="start each worker from the same build as the server: mainline's ggml-rpc-server and ik_llama.cpp's "
        "rpc-server do not speak each other's protocol, and mainline's changes between versions (a worker's "
        "banner names its version: Starting RPC server vX); a node's worker that moetune starts runs the node's "
        "engine build",
        evidence=_ev(log, [line]),
    )


def server_exit(
    name: str,
    log: ServerLog,
    exit_code: int | None,
    *,
    loading: bool,
    layers: Sequence[LayerExperts] = (),
    uniform: tuple[float, int] | None = None,
    n_ubatch: int | None = None,
    rpc_outside: Sequence[str] = (),
    workers: Mapping[str, WorkerLog] | None = None,
) -> Diagnosis:
    """A server that exited: during load (``loading``) or while serving. ``rpc_outside``: the RPC
    workers it uses that this run did not start; ``workers``: the logs of those it started, by
    endpoint."""
    code = "" if exit_code is None else f" (exit {exit_code})"
    kinds = {f.kind: f for f in log.failures}
    if log.alloc_failures:
        return out_of_memory(name, log, log.alloc_failures[0], layers, uniform=uniform, n_ubatch=n_ubatch)
    for kind, code_, says, remedy in _PLAIN_FAILURES:
        if kind in kinds:
            f = kinds[kind]
            return Diagnosis(
                cause=code_,
                process=name,
                message=f"{name}: " + says.format(subject=f.subject),
                hint=remedy.format(subject=f.subject),
                evidence=_ev(log, [f.line]),
            )
    if RPC_CONNECT_FAILED in kinds:
        f = kinds[RPC_CONNECT_FAILED]
        return rpc_unreachable(name, f.subject or "?", "the server could not connect", _ev(log, [f.line]))
    if RPC_CRASHED in kinds:
        f = kinds[RPC_CRASHED]
        if loading and log.phase == LogPhase.STARTING:
            own = workers or {}
            return rpc_handshake(name, log, f.line, exit_code, endpoints=[*own, *rpc_outside], workers=own)
        return Diagnosis(
            cause=RPC_LOST,
            process=name,
            message=f"{name}: lost its RPC worker (it crashed or was stopped first)",
            hint="see the worker's log; stop servers before workers (moetune stop does)",
            evidence=_ev(log, [f.line]),
        )
    if BAD_ARGUMENT in kinds:
        f = kinds[BAD_ARGUMENT]
        hint = "check the flag against this engine's dialect and version (llama-server --help)"
        if (f.subject or "").startswith("-fa:"):
            hint = (
                "this build's -fa takes a value (-fa on|off|auto): a bare -fa takes the next flag as its value; "
                "plan with --engine naming this engine and moetune renders what the build accepts"
            )
        elif (f.subject or "").endswith(": invalid value"):
            hint = (
                "the value is not one this build takes, or the flag before it took this one as its value "
                "(llama-server --help)"
            )
        if "unknown buffer type" in (f.subject or ""):
            hint = (
                "name a buffer type the engine lists (its log shows them: CPU, CUDA0, RPC0[host:port]); "
                "an RPC device's exists only once --rpc comes before the -ot that names it"
            )
        return Diagnosis(
            cause=BAD_ARGS,
            process=name,
            message=f"{name}: the engine rejected an argument: {f.subject}",
            hint=hint,
            evidence=_ev(log, [f.line]),
        )
    if crashed_repacking(log, exit_code, loading=loading):
        return repack_crash(name, log, exit_code)
    if crashed_connecting(log, exit_code, loading=loading, outside=rpc_outside):
        return stale_worker(name, log, exit_code, rpc_outside)
    last = [e.line for e in log.errors][-4:]
    if ABORTED in kinds:
        last = [kinds[ABORTED].line, *last]
    if MODEL_LOAD_FAILED in kinds:
        last = [kinds[MODEL_LOAD_FAILED].line, *last]
    what = log.errors[-1].text if log.errors else "no error line in its log"
    if loading:
        return Diagnosis(
            cause=EXITED_DURING_LOAD,
            process=name,
            message=f"{name}: exited during load{code}, while {log.phase}: {what}",
            hint="read the evidence lines; `moetune doctor` on the run shows the whole log's findings",
            evidence=_ev(log, last),
        )
    return Diagnosis(
        cause=EXITED,
        process=name,
        message=f"{name}: exited while serving{code}: {what}",
        hint="read the evidence lines; `moetune doctor` on the run shows the whole log's findings",
        evidence=_ev(log, last),
    )


def worker_exit(
    name: str, log: WorkerLog, exit_code: int | None, endpoint: str, *, listening: bool = False
) -> Diagnosis:
    """A worker that exited: before it listened (a launch), or after (``listening``: while serving)."""
    code = "" if exit_code is None else f" (exit {exit_code})"
    if listening:
        return Diagnosis(
            cause=EXITED,
            process=name,
            message=f"{name}: RPC worker {endpoint} exited{code}",
            hint="its servers lost their device: read the worker's log, then launch again",
            evidence=_ev(log, [e.line for e in log.errors][-3:]),
        )
    for f in log.failures:
        if f.kind == BIND_FAILED:
            return Diagnosis(
                cause=PORT_IN_USE,
                process=name,
                message=f"{name}: could not listen on {endpoint}: the port is in use",
                hint="stop what holds the port (`moetune ps`), or give the worker another port",
                evidence=_ev(log, [f.line]),
            )
    what = log.errors[-1].text if log.errors else "no error line in its log"
    return Diagnosis(
        cause=EXITED_DURING_LOAD,
        process=name,
        message=f"{name}: RPC worker exited before listening on {endpoint}{code}: {what}",
        hint="run the worker's command by hand to see why",
        evidence=_ev(log, [e.line for e in log.errors]),
    )


def ssh_failed(name: str, node: str, target: str, detail: str, *, evidence: tuple[Evidence, ...] = ()) -> Diagnosis:
    """ssh could not reach a node, or could not run the worker there."""
    return Diagnosis(
        cause=SSH_FAILED,
        process=name,
        message=f"{name}: cannot start it on node {node} over ssh ({detail})",
        hint=f"check that `ssh -o BatchMode=yes {target} true` works without a prompt (key or agent, "
        "host key in known_hosts, the Host entry of your ssh config); MOETUNE_SSH_COMMAND sets "
        "other ssh options",
        evidence=evidence,
    )


def ssh_session_lost(name: str, node: str, endpoint: str, ssh_code: int | None, *, last: str) -> Diagnosis:
    """The ssh session carrying a worker ended before the worker did (its hangup ends the worker)."""
    code = "" if ssh_code is None else f"ssh exit {ssh_code}"
    why = "; ".join(x for x in (code, last) if x)
    return Diagnosis(
        cause=RPC_LOST,
        process=name,
        message=f"{name}: the ssh session to node {node} ended ({why or 'no reason given'}); "
        f"the RPC worker {endpoint} ends with it",
        hint="check the link and ssh between the nodes (keep-alives: ServerAliveInterval), then launch again",
    )


def rpc_unreachable(name: str, endpoint: str, why: str, evidence: tuple[Evidence, ...] = ()) -> Diagnosis:
    return Diagnosis(
        cause=RPC_UNREACHABLE,
        process=name,
        message=f"{name}: RPC worker {endpoint} is unreachable ({why})",
        hint="start ggml-rpc-server there first (a plan's own workers are started by `moetune launch`), "
        "and check the address and the firewall",
        evidence=evidence,
    )


def short_command(cmd: str, limit: int = 240) -> str:
    """A command line whole, or, past ``limit`` characters, its start and its end (where a server's
    --host/--port usually are) around an ellipsis."""
    if len(cmd) <= limit:
        return cmd
    tail = limit // 3
    return f"{cmd[: limit - tail - 3].rstrip()} … {cmd[-tail:].lstrip()}"


def port_in_use(name: str, endpoint: str, holder: tuple[int, str] | None) -> Diagnosis:
    by = f" by pid {holder[0]} ({short_command(holder[1])})" if holder else ""
    return Diagnosis(
        cause=PORT_IN_USE,
        process=name,
        message=f"{name}: {endpoint} is already in use{by}",
        hint="stop that process (`moetune ps` / `moetune stop RUN` if moetune started it), "
        "or give the process another port in the plan",
    )


def binary_missing(name: str, detail: str) -> Diagnosis:
    return Diagnosis(
        cause=BINARY_MISSING,
        process=name,
        message=f"{name}: {detail}",
        hint="build the engine (`moetune engine install`), or register the directory that holds it (`moetune engine add`)",
    )


def model_missing(name: str, path: str) -> Diagnosis:
    return Diagnosis(
        cause=MODEL_MISSING,
        process=name,
        message=f"{name}: model file {path} does not exist",
        hint="fix the -m path in the plan, or download the model there",
    )


def not_healthy(name: str, url: str, waited_s: float, log: ServerLog) -> Diagnosis:
    return Diagnosis(
        cause=NOT_HEALTHY,
        process=name,
        message=f"{name}: {url}/health not 200 after {waited_s:.0f} s (last phase: {log.phase})",
        hint="give it longer with --timeout, or read its log",
        evidence=_ev(log, [e.line for e in log.errors][-3:]),
    )


def layer_experts_from_plan(plan: Mapping[str, object], process: str | None = None) -> list[LayerExperts]:
    """Where the plan put each layer's experts, and how much they weigh.

    Reads ``moetune plan --json``: ``services[].layers[]`` entries ``{"index": 3, "experts":
    {"ffn_up_exps": "CUDA0", ...}, "expert_mib": 4088.0}`` (the service whose name is the
    process's, else all of them); a top-level ``layers`` list of the same entries is read too.
    A layer whose expert tensors sit on several devices counts on each by its share of them.
    """

    def listed(x: object) -> list[object]:
        return list(x) if isinstance(x, list) else []

    entries: list[object] = []
    for svc in listed(plan.get("services")):
        if isinstance(svc, dict) and (process is None or svc.get("name") in (process, None)):
            entries += listed(svc.get("layers"))
    entries += listed(plan.get("layers"))
    out: list[LayerExperts] = []
    for x in entries:
        if not isinstance(x, dict):
            continue
        idx, mib, experts = x.get("index", x.get("layer")), x.get("expert_mib"), x.get("experts")
        if not isinstance(idx, int) or not isinstance(mib, int | float) or not mib:
            continue
        if isinstance(experts, dict) and experts:
            for dev in sorted(set(map(str, experts.values()))):
                share = sum(1 for d in experts.values() if d == dev) / len(experts)
                out.append(LayerExperts(idx, dev, float(mib) * share))
        elif x.get("device"):
            out.append(LayerExperts(idx, str(x["device"]), float(mib)))
    return out
