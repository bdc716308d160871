"""`plan --verify`: the engine's own allocation for the plan's exact command, beside the ledger.

mainline llama.cpp: ``llama-fit-params`` with the service's arguments builds the model and context
without loading weights and prints its ``memory breakdown`` per device (whole MiB). Its compute
buffers are reserved for the logits of every ubatch token (``llama_context``'s default
``n_outputs_max = n_batch``) where llama-server reserves one token's per slot
(``server_output_limits``), so the plan's side of the comparison is its dry-run compute figure
(``ServiceMemory.dry_run_compute_mib``), not the server's it plans with; ik_llama.cpp:
``llama-server --dry-run`` skips loading tensors and logs every buffer, and is stopped once it has
reserved its compute buffers. Both need the plan's RPC workers listening, as the server would.
Comparing is pure (``compare``); running the tools is the shell around it.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from moetune.engine.argv import strip_flags
from moetune.engine.logs import parse_log
from moetune.engine.registry import Engine
from moetune.errors import InputError
from moetune.jsonread import mapping, mappings, real, strings
from moetune.kinds import EngineKind
from moetune.plan.plan import ServicePlan
from moetune.run.process import end

# a device agrees when each figure is within these shares (or 1 MiB: mainline prints whole MiB);
# ik_llama.cpp's compute model is fitted, and coarse for the host beside accelerators (plan/compute.py)
TOLERANCE = {"model": 0.005, "context": 0.01, "compute": 0.10}
IK_HOST_COMPUTE_TOLERANCE = 0.40
IK_RESERVED = "graph splits"  # ik's last line of the context's reserve
FIT_PARAMS_NOTE = (
    "compute: llama-fit-params reserves the logits of every ubatch token, llama-server one per slot; "
    "both compute columns are llama-fit-params' case (the plan's own compute figures are llama-server's)"
)


@dataclass(frozen=True, slots=True)
class Figures:
    device: str  # the plan's name for it
    model_mib: float
    context_mib: float  # KV cache and recurrent state (and ik_llama.cpp's output buffer)
    compute_mib: float

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.device,
            "model_mib": round(self.model_mib, 2),
            "context_mib": round(self.context_mib, 2),
            "compute_mib": round(self.compute_mib, 2),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Verification:
    service: str
    tool: str | None
    ledger: tuple[Figures, ...] = ()
    engine: tuple[Figures, ...] = ()
    disagreements: tuple[str, ...] = ()
    why: str | None = None  # why there is no engine figure (no tool, the tool failed)
    note: str | None = None  # what the figures compare, where it is not the obvious

    @property
    def agree(self) -> bool | None:
        return None if self.why is not None else not self.disagreements

    def to_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "tool": self.tool,
            "devices": [f.to_json() for f in self.engine],
            "ledger": [f.to_json() for f in self.ledger],
            "agree": self.agree,
            "disagreements": list(self.disagreements),
            "why": self.why,
            "note": self.note,
        }


def ledger_figures(sp: ServicePlan, dry_run: bool = False) -> list[Figures]:
    """The plan's own figures for its service, per device (accelerators, then the CPU). ``dry_run``:
    the compute buffers as llama-fit-params projects them (the logits of every ubatch token, where
    llama-server reserves one per slot), to compare with its breakdown."""
    out = []
    for d in [*sp.hw.accelerators(), sp.hw.cpu()]:
        items = {i.what: i.mib for i in sp.memory.items.get(d.name, [])}
        compute = items.get("compute", 0.0)
        if dry_run and sp.memory.dry_run_compute_mib:
            compute = sp.memory.dry_run_compute_mib.get(d.name, 0.0)
        weights = items.get("weights", 0.0) + items.get("weights (split)", 0.0) + items.get("repack", 0.0)
        # mainline's memory breakdown has the KV cache (and recurrent state) as context, not the
        # output buffer (llama_context::memory_breakdown: model, memory, compute); ik logs it beside
        # its KV, and its figures count it
        output = 0.0 if sp.spec.settings.engine == EngineKind.MAINLINE else items.get("output", 0.0)
        out.append(Figures(d.name, weights, items.get("kv", 0.0) + output, compute))
    return out


def compare(
    ledger: list[Figures], engine: list[Figures], slack_mib: float, host_compute_tol: float | None = None
) -> list[str]:
    """What disagrees beyond TOLERANCE (or ``slack_mib``, the engine's rounding); ``host_compute_tol``:
    a wider bound for the CPU's compute beside accelerators."""
    theirs = {f.device: f for f in engine}
    hosting = len(ledger) > 1  # the CPU builds the inputs for accelerators
    out = []
    for ours in ledger:
        e = theirs.get(ours.device)
        if e is None:
            if ours.model_mib + ours.context_mib + ours.compute_mib > slack_mib:
                out.append(f"{ours.device}: the engine reports no buffer there")
            continue
        for what, tol in TOLERANCE.items():
            if what == "compute" and hosting and ours.device == "CPU" and host_compute_tol is not None:
                tol = host_compute_tol
            a, b = getattr(ours, f"{what}_mib"), getattr(e, f"{what}_mib")
            if abs(a - b) > max(tol * b, slack_mib):
                out.append(
                    f"{ours.device} {what}: plan {a:,.1f} MiB, engine {b:,.1f} MiB ({(a - b) / max(b, 1e-9):+.0%})"
                )
    return out


def mainline_figures(text: str, names: dict[str, str]) -> list[Figures]:
    """The first memory breakdown llama-fit-params prints (the projection for the given arguments),
    its rows named as the plan names devices (``names``: engine name -> plan name; Host is the CPU)."""
    log = parse_log(text)
    if not log.memory_breakdowns:
        return []
    acc: dict[str, list[float]] = {}
    for r in log.memory_breakdowns[0].rows:
        name = "CPU" if r.name == "Host" or r.name.startswith("CPU") else names.get(r.name, r.name)
        f = acc.setdefault(name, [0.0, 0.0, 0.0])
        f[0] += r.model_mib
        f[1] += r.context_mib
        f[2] += r.compute_mib
    return [Figures(d, *v) for d, v in acc.items()]


def ik_figures(text: str) -> list[Figures]:
    """Every buffer ik_llama.cpp logs, per device (mapped and repacked CPU buffers count as the CPU's)."""
    acc: dict[str, list[float]] = {}
    for dev, b in parse_log(text).device_buffers().items():
        key = "CPU" if dev.startswith("CPU") else dev
        f = acc.setdefault(key, [0.0, 0.0, 0.0])
        f[0] += b.model_mib
        f[1] += b.kv_mib + b.rs_mib + b.output_mib
        f[2] += b.compute_mib
    return [Figures(d, *v) for d, v in acc.items()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_until(cmd: list[str], marker: str | None, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd``; return (exit code, or None when stopped at ``marker``; its output)."""
    with tempfile.TemporaryFile("w+") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        t0 = time.monotonic()
        rc: int | None = None
        try:
            while time.monotonic() - t0 < timeout_s:
                rc = p.poll()
                if rc is not None:
                    break
                if marker is not None:
                    f.seek(0)
                    if marker in f.read():
                        break
                time.sleep(0.05)
        finally:
            end(p)
        f.seek(0)
        return rc, f.read()


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """What one dry run checks: a service's ledger per device, the engine's names for the plan's
    devices, and the service's exact arguments (after llama-server)."""

    service: str
    ledger: tuple[Figures, ...]
    names: dict[str, str]  # engine name -> plan name
    argv: list[str]
    engine: str | None = None  # engine name (moetune engine list); None: the default
    remote_model: bool = False  # planned from a URL: no files to dry-run
    gpus: tuple[str, ...] = ()  # the local GPUs the service uses (what a container is given)


def subject(sp: ServicePlan, argv: list[str]) -> Subject:
    from moetune.engine.command import service_gpus

    return Subject(
        service=sp.spec.name,
        ledger=tuple(ledger_figures(sp, dry_run=True)),
        names={v: k for k, v in sp.hw.engine_names().items()},
        argv=argv,
        engine=sp.spec.engine or None,
        remote_model=sp.spec.model.remote is not None,
        gpus=service_gpus(sp),
    )


def doc_subjects(doc: Mapping[str, object]) -> list[Subject]:
    """The subjects of a plan document (what `launch --verify` has): each service's figures from its
    own device ledger in the document, RPC devices numbered as the engine numbers them, its engine
    from the launch section."""
    from moetune.model.profile import is_url

    devices = mappings(doc.get("devices"))
    order = [str(d["name"]) for d in devices]
    kinds = {str(d["name"]): d.get("kind") for d in devices}
    names = {f"RPC{k}": n for k, n in enumerate(n for n in order if kinds[n] == "rpc")}
    procs = mappings(mapping(doc.get("launch")).get("processes"))
    engines = {str(p["name"]): None if p.get("engine") is None else str(p.get("engine")) for p in procs}
    gpus = {str(p["name"]): tuple(strings(p.get("gpus"))) for p in procs}
    out = []
    for sj in mappings(doc.get("services")):
        figs = []
        dry = mapping(sj.get("dry_run_compute_mib"))  # absent from plans written before it
        ledger = mapping(sj.get("devices"))
        for dev in order:
            items: dict[str, float] = {}
            for i in mappings(ledger.get(dev)):
                items[str(i["what"])] = items.get(str(i["what"]), 0.0) + real(i["mib"])
            figs.append(
                Figures(
                    dev,
                    items.get("weights", 0.0) + items.get("weights (split)", 0.0) + items.get("repack", 0.0),
                    items.get("kv", 0.0) + items.get("output", 0.0),
                    real(dry.get(dev, 0.0)) if dry else items.get("compute", 0.0),
                )
            )
        service = str(sj["name"])
        out.append(
            Subject(
                service=service,
                ledger=tuple(figs),
                names=names,
                argv=strings(sj.get("argv")),
                engine=engines.get(service),
                remote_model=is_url(str(sj.get("model", ""))),
                gpus=gpus.get(service, ()),
            )
        )
    return out


def verify_service(sub: Subject, engine: Engine | None, timeout_s: float = 120.0) -> Verification:
    """Run the engine's dry run for one service's exact argv."""
    ledger, name, argv = sub.ledger, sub.service, sub.argv
    if sub.remote_model:
        return Verification(
            service=name,
            tool=None,
            ledger=ledger,
            why="the model is planned from its headers and not downloaded yet: "
            "--verify needs the files (download them, then plan the local copy)",
        )
    if engine is None or not engine.available:
        why = "the engine is not built here" if engine is None or engine.image is None else engine.missing
        return Verification(
            service=name, tool=None, ledger=ledger, why=f"{why}: nothing to dry-run (moetune engine list)"
        )
    role = "fit" if engine.kind == EngineKind.MAINLINE else "server"
    try:
        tool = engine.binary(role) if engine.image is None else PurePosixPath(engine.entrypoint(role) or "llama-server")
    except InputError:  # a registered build or image without llama-fit-params
        return Verification(service=name, tool=None, ledger=ledger, why=f"engine {engine.name} has no llama-fit-params")
    if engine.kind == EngineKind.MAINLINE:
        cmd = [str(tool), *strip_flags(argv), "-lv", "4"]
        rc, out = _dry_run(engine, sub, cmd, None, timeout_s=timeout_s)
        figures = mainline_figures(out, sub.names)
        slack = 1.0
    else:
        cmd = [
            str(tool),
            *strip_flags(argv, {"--host", "--port"}, ()),
            "--dry-run",
            "--host",
            "127.0.0.1",
            "--port",
            str(_free_port()),
            "--no-warmup",
        ]
        rc, out = _dry_run(engine, sub, cmd, IK_RESERVED, timeout_s=timeout_s)
        figures = ik_figures(out) if rc is None else []
        slack = 0.02
    tool_name = tool.name
    if not figures:
        last = [ln for ln in out.splitlines() if ln.strip()][-3:]
        return Verification(
            service=name,
            tool=tool_name,
            ledger=ledger,
            why=f"{tool_name} gave no figures (exit {rc}): " + " | ".join(last),
        )
    missing = [f.device for f in ledger if f.device != "CPU" and f.device not in {e.device for e in figures}]
    if missing and len(missing) == len(ledger) - 1:
        return Verification(
            service=name,
            tool=tool_name,
            ledger=ledger,
            engine=tuple(figures),
            why=f"the engine sees none of the plan's devices ({', '.join(missing)}) here: --verify "
            "needs the hardware the plan is for, with its RPC workers listening",
        )
    mainline = engine.kind == EngineKind.MAINLINE
    said = compare(list(ledger), figures, slack, None if mainline else IK_HOST_COMPUTE_TOLERANCE)
    return Verification(
        service=name,
        tool=tool_name,
        ledger=ledger,
        engine=tuple(figures),
        disagreements=tuple(said),
        note=FIT_PARAMS_NOTE if mainline else None,
    )


def _dry_run(
    engine: Engine, sub: Subject, cmd: list[str], marker: str | None, *, timeout_s: float
) -> tuple[int | None, str]:
    """``run_until`` of the tool here, or, for an image engine, in a container of it (the image's
    ``cmd[0]``, the service's GPUs, the host's network for its RPC workers), removed afterwards."""
    if engine.image is None or engine.runtime is None:
        return run_until(cmd, marker, timeout_s)
    import moetune.run.container as container
    from moetune.engine.formats import Command, container_command

    box = container.container_name(f"verify-{secrets.token_hex(3)}", sub.service)
    entry = None if cmd[0] == "llama-server" else cmd[0]  # the image runs llama-server itself
    run = container_command(
        engine.runtime,
        engine.image,
        Command(sub.service, 0, tuple(cmd)),
        gpus=sub.gpus,
        name=box,
        entrypoint=entry,
        host_network=True,
    )
    try:
        return run_until(list(run.argv), marker, timeout_s)
    finally:
        container.remove(engine.runtime, box)


def verify_subjects(subjects: list[Subject], timeout_s: float = 120.0) -> list[Verification]:
    """Each service's dry run, by its own engine (a name moetune does not know: no dry run)."""
    from moetune.engine import registry

    out = []
    for sub in subjects:
        try:
            engine: Engine | None = registry.get(sub.engine)
        except InputError:
            engine = None
        out.append(verify_service(sub, engine, timeout_s))
    return out


def verify_plan(services: list[ServicePlan], argvs: list[list[str]], timeout_s: float = 120.0) -> list[Verification]:
    return verify_subjects([subject(sp, argv) for sp, argv in zip(services, argvs, strict=True)], timeout_s)


def verify_json(vs: list[Verification]) -> dict[str, object]:
    """The plan document's ``verify`` section: the first service's devices at the top (as for a
    plan of one model), every service's in ``services``; ``agree`` is null when nothing ran."""
    ran = [v for v in vs if v.agree is not None]
    many = len(vs) > 1
    return {
        "tool": next((v.tool for v in vs if v.tool), None),
        "devices": [f.to_json() for f in vs[0].engine] if vs else [],
        "agree": all(v.agree for v in ran) if ran else None,
        "disagreements": [f"{v.service}: {d}" if many else d for v in vs for d in v.disagreements],
        "why": "; ".join(f"{v.service}: {v.why}" if many else v.why for v in vs if v.why) or None,
        "services": [v.to_json() for v in vs],
    }
