"""The one record of a run's context that every kind of run writes and every reader uses.

A run row in the history holds its kind, label, target and status as columns, and this record as
JSON (``runs.meta``): what was measured (the server, the model, the machine, the plan that
launched it) and how (the command line, the kind's own options in ``details``). Readers never
guess a shape: :meth:`RunMeta.from_json` reads what :meth:`RunMeta.to_json` wrote, and histories
written before this record existed are upgraded by a migration (``store/migrations.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from moetune.kinds import RunKind

META_SCHEMA = 2


def _opt_int(x: Any) -> int | None:
    return int(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _opt_str(x: Any) -> str | None:
    return str(x) if x not in (None, "") else None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a server offers beyond the OpenAI API, as the benchmark's probe found it; the one
    answer every benchmark asks (:func:`moetune.bench.server.probe` decides it, once per server).

    llama-server (and ik_llama.cpp) has them all; vLLM, SGLang, LM Studio and Ollama's OpenAI API
    have none, and a benchmark against them measures with the client's clock and the responses'
    ``usage`` instead, leaving what needs these null with a warning."""

    props: bool = False  # /props (and /slots): slot count, context per slot, build, model file
    tokenize: bool = False  # llama-server's /tokenize: exact prompt lengths, token-id prompts
    apply_template: bool = False  # /apply-template: the chat template applied by the server
    timings: bool = False  # responses carry llama.cpp's `timings` (server PP/TG, cache_n, per-token times)

    @property
    def exact_prompts(self) -> bool:
        """Prompt lengths can be counted before sending (template, then tokenizer)."""
        return self.tokenize and self.apply_template

    @property
    def depth(self) -> bool:
        """Depth workloads: token-id prompts on llama-server's /completion, pinned to a slot."""
        return self.tokenize and self.props and self.timings

    def to_json(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, dialect: str) -> Capabilities:
        """Stored capabilities; a record written before they were stored has its dialect's."""
        if not isinstance(d, Mapping):
            return cls.llama() if dialect == "llama.cpp" else cls()
        return cls(**{f.name: bool(d.get(f.name)) for f in fields(cls)})

    @classmethod
    def llama(cls) -> Capabilities:
        return cls(props=True, tokenize=True, apply_template=True, timings=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """What a server said about itself when a benchmark began; None where it did not say."""

    url: str = ""
    dialect: str = "openai"  # "llama.cpp" when /props answered
    build: str | None = None
    model_path: str | None = None
    model_alias: str | None = None
    slots: int | None = None  # /props total_slots
    n_ctx_slot: int | None = None  # context per slot
    busy_slots: int | None = None  # slots processing when the benchmark started
    props: Mapping[str, Any] = field(default_factory=dict)  # /props without the template and defaults
    caps: Capabilities = field(default_factory=Capabilities)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "props": dict(self.props), "caps": self.caps.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServerInfo:
        props = d.get("props")
        return cls(
            url=str(d.get("url") or ""),
            dialect=str(d.get("dialect") or "openai"),
            build=_opt_str(d.get("build")),
            model_path=_opt_str(d.get("model_path")),
            model_alias=_opt_str(d.get("model_alias")),
            slots=_opt_int(d.get("slots")),
            n_ctx_slot=_opt_int(d.get("n_ctx_slot")),
            busy_slots=_opt_int(d.get("busy_slots")),
            props=dict(props) if isinstance(props, Mapping) else {},
            caps=Capabilities.from_json(d.get("caps"), str(d.get("dialect") or "openai")),
        )


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The model that was measured: its file (when readable from here), structural fingerprint,
    and the name requests carried (OpenAI ``model``)."""

    path: str | None = None
    fingerprint: str | None = None
    name: str | None = None
    note: str | None = None  # why the fingerprint is missing

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelRef:
        return cls(*(_opt_str(d.get(f.name)) for f in fields(cls)))


@dataclass(frozen=True, slots=True)
class HostRef:
    """The machine moetune ran on (``hardware.fingerprint``), and the hardware file it was told about."""

    fingerprint: str | None = None
    facts: Mapping[str, str] = field(default_factory=dict)  # cpu, cores, ram_kib, gpus, hostname
    hardware_file: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"fingerprint": self.fingerprint, "facts": dict(self.facts), "hardware_file": self.hardware_file}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HostRef:
        facts = d.get("facts")
        return cls(
            _opt_str(d.get("fingerprint")),
            {str(k): str(v) for k, v in facts.items()} if isinstance(facts, Mapping) else {},
            _opt_str(d.get("hardware_file")),
        )

    @classmethod
    def here(cls, hardware_file: str | None = None) -> HostRef:
        """This machine, as the run that is starting now records it."""
        from moetune.hardware.fingerprint import fingerprint, machine_facts

        facts = machine_facts()
        return cls(fingerprint(facts), facts, hardware_file)

    def describe(self) -> str:
        f = self.facts
        what = ", ".join(
            x for x in (f.get("cpu", ""), f"{f['cores']} cores" if f.get("cores") else "", f.get("gpus", "")) if x
        )
        return (
            f"{self.fingerprint or '-'}"
            + (f" ({what})" if what else "")
            + (f", hardware file {self.hardware_file}" if self.hardware_file else "")
        )


NO_RPC = "none"  # the transport of a server that uses no RPC worker


@dataclass(frozen=True, slots=True)
class LaunchRef:
    """How moetune launched the measured server: the RPC transport asked for (``none`` when the
    server uses no RPC worker), the one each of its workers' logs showed, and the seconds from the
    server's process start to its first healthy answer (``load_s``: loading the weights, over the
    RPC link for a worker's share)."""

    transport: str = NO_RPC  # asked: tcp | rdma | auto, or none
    workers: Mapping[str, str | None] = field(default_factory=dict)  # RPC worker -> TCP | RDMA, from its log
    load_s: float | None = None

    @property
    def confirmed(self) -> str:
        """What the workers' logs showed: TCP, RDMA (both joined when they differ), ``unknown``
        when no log told, ``none`` without RPC."""
        if self.transport == NO_RPC:
            return NO_RPC
        seen = sorted({w or "unknown" for w in self.workers.values()}) or ["unknown"]
        return "+".join(seen)

    def describe(self) -> str:
        """``TCP (asked tcp; rpc0 TCP), loaded in 3.2 s``."""
        what = (
            "none (no RPC worker)"
            if self.transport == NO_RPC
            else f"{self.confirmed} (asked {self.transport}"
            + "".join(f"; {w} {t or 'unknown'}" for w, t in self.workers.items())
            + ")"
        )
        return what + ("" if self.load_s is None else f", loaded in {self.load_s:.1f} s")

    def to_json(self) -> dict[str, object]:
        return {
            "transport": self.transport,
            "confirmed": self.confirmed,
            "workers": dict(self.workers),
            "load_s": self.load_s,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LaunchRef:
        workers = d.get("workers")
        load = d.get("load_s")
        return cls(
            str(d.get("transport") or NO_RPC),
            {str(k): _opt_str(v) for k, v in workers.items()} if isinstance(workers, Mapping) else {},
            float(load) if isinstance(load, int | float) and not isinstance(load, bool) else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeta:
    """Everything a run records about its context. ``details`` holds the kind's own settings as
    plain JSON (bench: ``workloads``, ``options``; serve-bench: ``workload``, ``client``,
    ``run_tag``, ``skipped_overlong``; link-test: ``from``, ``to``, ``addr``, ``port``, ``tool``,
    ``duration_s``)."""

    kind: RunKind
    moetune_version: str = ""
    argv: tuple[str, ...] = ()
    started_unix: float | None = None
    server: ServerInfo | None = None
    model: ModelRef = field(default_factory=ModelRef)
    host: HostRef = field(default_factory=HostRef)
    engine_build: str | None = None
    plan: Mapping[str, Any] | None = None  # the plan document a launched server came from
    launch_run: str | None = None  # `moetune launch`'s run id: its directory holds the logs
    details: Mapping[str, Any] = field(default_factory=dict)
    launch: LaunchRef | None = None  # the transport and load time of the launch behind the server

    def to_json(self) -> dict[str, object]:
        return {
            "schema_version": META_SCHEMA,
            "kind": str(self.kind),
            "moetune_version": self.moetune_version,
            "argv": list(self.argv),
            "started_unix": self.started_unix,
            "server": None if self.server is None else self.server.to_json(),
            "model": self.model.to_json(),
            "host": self.host.to_json(),
            "engine_build": self.engine_build,
            "plan": None if self.plan is None else dict(self.plan),
            "launch_run": self.launch_run,
            "details": dict(self.details),
            "launch": None if self.launch is None else self.launch.to_json(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], kind: str) -> RunMeta:
        """Read a stored record (schema 2; the migration upgraded older ones). Missing parts come
        back empty, never as a crash: a reader shows what is there."""

        def obj(key: str) -> Mapping[str, Any]:
            v = d.get(key)
            return v if isinstance(v, Mapping) else {}

        started = d.get("started_unix")
        return cls(
            kind=RunKind(kind),
            moetune_version=str(d.get("moetune_version") or ""),
            argv=tuple(str(a) for a in d.get("argv") or ()),
            started_unix=float(started) if isinstance(started, int | float) else None,
            server=ServerInfo.from_json(obj("server")) if obj("server") else None,
            model=ModelRef.from_json(obj("model")),
            host=HostRef.from_json(obj("host")),
            engine_build=_opt_str(d.get("engine_build")),
            plan=dict(obj("plan")) if d.get("plan") is not None else None,
            launch_run=_opt_str(d.get("launch_run")),
            details=dict(obj("details")),
            launch=LaunchRef.from_json(obj("launch")) if obj("launch") else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceRecord:
    """One service of a layout run (a ``run_services`` row): the plan's server it is, what that
    server answered, its model, how it was launched, and the workload it was given (``workload``:
    :meth:`moetune.bench.serve.loadspec.ServiceLoad.to_json`)."""

    name: str
    position: int
    server: ServerInfo
    model: ModelRef = field(default_factory=ModelRef)
    launch: LaunchRef | None = None
    argv: tuple[str, ...] = ()  # the server's argv as launched
    workload: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "position": self.position,
            "server": self.server.to_json(),
            "model": self.model.to_json(),
            "launch": None if self.launch is None else self.launch.to_json(),
            "argv": list(self.argv),
            "workload": dict(self.workload),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServiceRecord:
        def obj(key: str) -> Mapping[str, Any]:
            v = d.get(key)
            return v if isinstance(v, Mapping) else {}

        return cls(
            name=str(d.get("name") or ""),
            position=int(d.get("position") or 0),
            server=ServerInfo.from_json(obj("server")),
            model=ModelRef.from_json(obj("model")),
            launch=LaunchRef.from_json(obj("launch")) if obj("launch") else None,
            argv=tuple(str(a) for a in d.get("argv") or ()),
            workload=dict(obj("workload")),
        )
