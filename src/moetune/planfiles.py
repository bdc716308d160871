"""The planner's files: what a plan is made from (the hardware file, the model or a layout file, the
engine registry, the stored calibration) and the plan's JSON document, shared by `moetune plan`
(``moetune.app.plan``, the use case) and `moetune tune`. Planning itself (``moetune.plan``) stays
pure; the commands and the document come from ``moetune.engine.command``.

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

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moetune.engine import registry
from moetune.engine.command import plan_json
from moetune.engine.facts import EngineFacts
from moetune.engine.server_args import lift_extra, own_flags
from moetune.errors import InputError
from moetune.hardware import inventory
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile, is_url, load_profile
from moetune.model.routing import Routing, read_routing
from moetune.plan import priors
from moetune.plan.plan import Plan, ServiceSpec
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


@dataclass(frozen=True, slots=True, kw_only=True)
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
    return Inputs(hw=hw, engine=name, kind=kind, calib=calib, constants=k)


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
