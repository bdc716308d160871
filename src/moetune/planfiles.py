"""The planner's edge: what `moetune plan` reads (the hardware file, the model or a layout file, the
engine registry) and writes (the plan JSON). Planning itself (``moetune.plan``) stays pure; the
commands and the document come from ``moetune.engine.command``.

Layout files describe several services sharing the hardware (an orchestrator MoE model and workers):

```yaml
services:
  - name: orchestrator
    model: GLM-5.1-IQ3_KS-00001-of-00008.gguf   # relative to this file (the plan stores it absolute)
    strategy: auto            # takes what the workers leave
    ctx: 32768
    ctk: q8_0
    ctv: q8_0
    batch: 8192
    ubatch: 8192
  - name: coder1
    model: Qwen3-Coder-Next-Q4_0.gguf
    devices: [CUDA0]
    strategy: all-gpu
    parallel: 2
    ctx: 262144               # 128k per slot
    port: 8081
```
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moetune.engine import registry
from moetune.engine.command import plan_json
from moetune.engine.facts import EngineFacts
from moetune.engine.launchspec import check_process_name
from moetune.engine.server_args import lift_extra, own_flags
from moetune.errors import InputError
from moetune.hardware import inventory
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile, is_url, load_profile, open_model
from moetune.model.routing import Routing, read_routing
from moetune.plan import priors
from moetune.plan.attention import Choose
from moetune.plan.plan import Plan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, base_constants
from moetune.store import calibrations


def absolute(path: str | Path) -> Path:
    """The path as it works from any directory: absolute, without ``..`` (symbolic links kept)."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def load_layout(path: str | Path, base: Settings, base_port: int = 8080) -> list[tuple[ServiceSpec, str]]:
    """The layout's services, each with its model path as the file gives it (models are found relative
    to the layout file and stored absolute)."""
    from moetune.layout_schema import read_layout  # pydantic and yaml: only for a layout file

    p = absolute(path)
    doc = read_layout(p)
    out = []
    for i, s in enumerate(doc.services):
        server = replace(
            base.server,
            extra_args=(*base.server.extra_args, *s.args),
            env=(*base.server.env, *((str(k), str(v)) for k, v in s.env.items())),
        )
        settings = replace(
            base,
            ctx=s.ctx,
            slots=s.parallel,
            batch=s.batch,
            ubatch=s.ubatch,
            ctk=s.ctk,
            ctv=s.ctv,
            flash_attn=s.flash_attn,
            amb_mib=s.amb,
            threads=s.threads or base.threads,
            threads_batch=s.threads_batch or base.threads_batch,
            server=server,
            ctx_checkpoints=base.ctx_checkpoints if s.ctx_checkpoints is None else s.ctx_checkpoints,
            split_mode=s.split_mode or base.split_mode,
            cache_ram_mib=base.cache_ram_mib if s.cache_ram is None else s.cache_ram,
        )
        settings = lift_extra(settings)  # the service's args: flags a plan option says, taken as it
        model = s.model if is_url(s.model) else absolute(p.parent / os.path.expanduser(s.model))
        spec = ServiceSpec(
            name=s.name,
            model=load_profile(model),
            settings=settings,
            strategy=s.strategy,
            port=s.port or base_port + i,
            devices=tuple(s.devices) if s.devices is not None else None,
            engine=s.engine or "",
        )
        out.append((spec, s.model))
    return out


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What `moetune plan` was asked: a model or a layout file, on a hardware file."""

    hw: str  # a hardware file, or a built-in example's name
    model: str | Path | None = None  # a GGUF file (any shard) or an http(s) URL of one
    layout: Path | None = None
    strategy: str = "auto"
    settings: Settings = field(default_factory=Settings)  # its engine kind is resolved from ``engine``
    engine: str | None = None  # engine name or kind (default: the default engine)
    port: int = 8080
    speed: tuple[str, ...] = ()  # NAME=VALUE overrides of the speed model's constants
    output: Path | None = None  # also write the plan's JSON here
    hf: str | None = None  # OWNER/REPO[:QUANT] instead of ``model``
    http_timeout_s: float = 30.0  # for a remote model
    routing: Path | None = None  # an imatrix GGUF: the model's measured expert routing
    recipe: Path | None = None  # plan the model this quant recipe makes of MODEL (`moetune quantize`)
    recipe_output: Path | None = None  # where that model will be written (default: recipe.default_output)
    choose: Choose = field(default_factory=Choose)  # flash attention / cache type left to the speed model


@dataclass(frozen=True, slots=True)
class Planned:
    plan: Plan
    doc: dict[str, Any]  # the plan's JSON document (engine.command.plan_json)
    notices: list[tuple[str, str]]  # (message, remedy) to tell before the plan: what the hardware file allows


def speed_overrides(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep:
            raise InputError(f"--speed {v!r}: expected NAME=VALUE")
        out[k.strip()] = val.strip()
    return out


def _with_engine(s: ServiceSpec, engine: str, kind: EngineKind) -> ServiceSpec:
    """A layout service on its own engine (else the plan's): its name for launching, its kind for the flags."""
    if s.engine:
        engine, kind = registry.resolve(s.engine)
    return replace(s, engine=engine, settings=replace(s.settings, engine=kind))


def layout_services(
    path: str | Path, base: Settings, base_port: int, engine: str, kind: EngineKind
) -> tuple[list[ServiceSpec], list[str]]:
    """A layout file's services on their engines (each its own, else the plan's), and their models
    as the file gives them."""
    loaded = load_layout(path, base, base_port)
    return [_with_engine(s, engine, kind) for s, _ in loaded], [g for _, g in loaded]


def calibration_for(hw: inventory.Inventory, kind: EngineKind) -> dict[str, Any] | None:
    """The stored calibration (`moetune calibrate`, `moetune tune`) for this hardware and engine kind."""
    return calibrations.find(hw.name or hw.source, str(kind))


@dataclass(frozen=True, slots=True)
class Inputs:
    """What every plan is made with, read once: the hardware, the engine (its name for launching,
    its kind for the flags) and the speed constants of the calibration stored for the two, if any."""

    hw: inventory.Inventory
    engine: str
    kind: EngineKind
    calib: dict[str, Any] | None
    constants: SpeedConstants


def read_inputs(hw_path: str | Path, engine: str | None) -> Inputs:
    hw = inventory.load(hw_path)
    name, kind = registry.resolve(engine)
    calib = calibration_for(hw, kind)
    # the CPU's measured attention terms (cpu.speed) over a calibration's: measured alone, not
    # confounded with the rest of a run
    k = base_constants(hw, SpeedConstants.from_json(calib["constants"]) if calib else None)
    return Inputs(hw, name, kind, calib, k)


def model_path(model: str | Path) -> str | Path:
    """A URL as given; a file's path absolute (the plan is launched from anywhere)."""
    return model if is_url(str(model)) else absolute(model)


def routing_for(path: Path | None, profile: ModelProfile) -> Routing | None:
    """The measured routing ``--routing`` names, for ``profile`` (None without one)."""
    if path is None:
        return None
    if not profile.n_expert:
        raise InputError(
            f"--routing {path}: the model ({profile.arch}) has no experts to route to",
            hint="leave --routing out for a dense model",
        )
    return read_routing(path, profile.n_expert, profile.n_expert_used)


def plan_facts(p: Plan) -> dict[str, EngineFacts]:
    """The facts of the plan's engines that are builds here, with the flags its services add tried."""
    engines = {s.spec.engine for s in p.services if s.spec.engine}
    tried = {n: [w for s in p.services if s.spec.engine == n for w in own_flags(s.spec.settings)] for n in engines}
    return registry.facts_for(engines, tried)


def unchecked_notices(p: Plan, facts: dict[str, EngineFacts]) -> list[tuple[str, str]]:
    """(message, remedy) for each service whose extra flags no build's help could check."""
    out = []
    for sp in p.services:
        extra, f = sp.spec.settings.server.extra_args, facts.get(sp.spec.engine or "")
        if extra and (f is None or not f.help_flags):
            out.append(
                (
                    f"service {sp.spec.name}: extra engine arguments {' '.join(extra)} not checked: engine "
                    f"{sp.spec.engine or sp.spec.settings.engine} is not a build here, its --help is unknown",
                    "install or register the build (`moetune engine install | add`) and plan again",
                )
            )
    return out


def document(
    p: Plan,
    engine: str,
    calib: dict[str, Any] | None,
    given: list[str],
    facts: dict[str, EngineFacts] | None = None,
    argvs: list[list[str]] | None = None,
) -> dict[str, Any]:
    """The plan's JSON document: commands, ledgers, predictions, the calibration its speed came from,
    the measured routing it used, and each service's model as the user gave it (``argvs``: other
    commands than the plan's own, as tune's engine-defaults baseline runs)."""
    from moetune.plan.calibrate import UNCALIBRATED_PCT

    doc: dict[str, Any] = plan_json(p, engine, facts=plan_facts(p) if facts is None else facts, argvs=argvs)
    doc["speed_calibration"] = (
        None
        if calib is None
        else {
            "runs": calib["runs"],
            "placements": calib.get("placements"),
            "error": calib["error"],
            "uncertainty": calib.get("uncertainty"),
            "created_unix": calib.get("created_unix"),
            "hardware": calib.get("hardware"),
            "engine": calib.get("engine"),
            "left_out_contended": calib.get("left_out_contended"),
        }
    )
    # the CPU's attention kernels as `moetune hw attention` measured them (cpu.speed), if it did
    doc["speed_cpu_measured"] = dict(p.hw.local.cpu_speed) or None
    band = (calib or {}).get("uncertainty") or {}
    doc["speed_uncertainty"] = {
        "source": "calibration" if calib else "built-in",
        "tg_pct": band.get("tg_pct") or UNCALIBRATED_PCT,
        "pp_pct": band.get("pp_pct") or UNCALIBRATED_PCT,
    }
    for sj, g, sp in zip(doc["services"], given, p.services, strict=True):
        sj["model_given"] = g  # what the user wrote; "model" and the commands hold the absolute path
        sj["routing"] = None if sp.spec.routing is None else sp.spec.routing.to_json()
    return doc


def listen_notices(services: list[ServiceSpec]) -> list[tuple[str, str]]:
    """(message, remedy) for each server that will listen beyond this machine."""
    out = []
    for s in services:
        o = s.settings.server
        if not o.public:
            continue
        auth = (
            "clients must send a key from " + o.api_key_file
            if o.api_key_file
            else "llama-server has no authentication without an API key: anyone who reaches it can use it"
        )
        out.append(
            (
                f"service {s.name} will listen on {o.host}:{s.port}, reachable from the network; {auth}",
                "keep a firewall in front of it"
                if o.api_key_file
                else "add --api-key-file FILE (one key per line), or --listen 127.0.0.1 to keep it local",
            )
        )
    return out


def _size(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


def recipe_profile(
    profile: ModelProfile, recipe_path: Path, kind: EngineKind, output: Path | None = None
) -> tuple[ModelProfile, tuple[str, str]]:
    """The model a quant recipe makes of ``profile`` (not written yet), and the notice that says so."""
    from moetune.engine.quantize import output_profile, plan_quantize
    from moetune.model.recipe import default_output, load_recipe

    if profile.remote is not None or len(profile.files) > 1:
        raise InputError(
            "--recipe plans the quantized copy of one local GGUF file", hint="download (and merge) the model first"
        )
    qp = plan_quantize(profile, load_recipe(recipe_path), kind, imatrix=True, allow_requantize=True)
    out = absolute(output or default_output(profile.files[0], recipe_path))
    return output_profile(profile, qp, out), (
        f"planned as {out}, the output of recipe {recipe_path} ({_size(qp.nbytes)} of tensors, from "
        f"{_size(profile.total_bytes)}); it is not written yet",
        f"moetune quantize {profile.files[0]} --recipe {recipe_path}"
        + ("" if kind == EngineKind.MAINLINE else f" --engine {kind}"),
    )


def plan_files(req: PlanRequest) -> Planned:
    """Read the files, plan, render the document (and write it to ``req.output``)."""
    if (req.model is None and req.hf is None) == (req.layout is None):
        raise InputError("give a MODEL (or --hf) or a --layout file (not both)")
    if req.recipe is not None and req.layout is not None:
        raise InputError(
            "--recipe is one model's quant recipe; a --layout plans several", hint="plan the model alone with --recipe"
        )
    if req.routing is not None and req.layout is not None:
        raise InputError(
            "--routing is one model's routing; a --layout plans several",
            hint="plan the MoE model alone with --routing, or leave it out",
        )
    inputs = read_inputs(req.hw, req.engine)
    hw, engine, kind = inputs.hw, inputs.engine, inputs.kind
    notices = [
        (
            f"node {node.name}: its RPC worker will listen on {why} (allow_public_bind); {inventory.RPC_NO_AUTH}",
            inventory.RPC_PUBLIC_BIND_REMEDY,
        )
        for node, why in inventory.public_binds(hw)
    ]
    base = replace(req.settings, engine=kind)
    if req.layout is not None:
        services, given = layout_services(req.layout, base, req.port, engine, kind)
        for s in services:
            try:
                check_process_name(s.name)
            except InputError as e:
                notices.append((f"{e} (`moetune launch` refuses it; the other formats carry it)", e.hint or ""))
    else:
        profile = open_model(None if req.model is None else model_path(req.model), req.hf, timeout_s=req.http_timeout_s)
        if req.recipe is not None:
            profile, note = recipe_profile(profile, req.recipe, kind, req.recipe_output)
            notices.append(note)
        services = [
            ServiceSpec(
                name="main",
                model=profile,
                settings=base,
                strategy=req.strategy,
                port=req.port,
                engine=engine,
                routing=routing_for(req.routing, profile),
                choose=req.choose,
            )
        ]
        given = [str(req.model) if req.hf is None else f"--hf {req.hf}"]
    notices += listen_notices(services)
    p = make_plan(services, hw, inputs.constants.with_overrides(speed_overrides(req.speed)))
    facts = plan_facts(p)
    notices += unchecked_notices(p, facts)
    doc = document(p, engine, inputs.calib, given, facts)
    if req.output:
        req.output.write_text(json.dumps(doc, indent=2))
    return Planned(p, doc, notices)


def published_priors(path: str | Path | None = None) -> priors.Table:
    """The table of published measurements shipped with moetune (``moetune/plan/priors/published.yaml``),
    or the one at ``path``; InputError where it does not parse or a row is incomplete."""
    from moetune import yamlfile

    where = Path(path) if path is not None else Path(priors.__file__).parent / priors.TABLE_FILE
    try:
        data = where.read_bytes()
    except OSError as e:
        raise InputError(f"{where}: cannot read the table of published measurements ({e.strerror})") from None
    return priors.parse_table(yamlfile.parse(data, str(where)), str(where))


def preset_profile(preset: str, recipe: str, workdir: Path) -> ModelProfile:
    """The profile of a preset's sparse replica in ``recipe`` (every tensor's header, no weights:
    ``moetune testmodel --preset NAME --sparse``), written under ``workdir`` once per recipe."""
    import hashlib

    from moetune.model.archs import PRESETS
    from moetune.model.testmodel import generate

    arch, dims = PRESETS[preset]
    tag = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    path = workdir / f"{preset}-{tag}.gguf"
    if not path.exists():
        generate(path, arch, dims, recipe, sparse=True)
    return load_profile(path)
