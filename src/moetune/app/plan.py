"""`moetune plan`: read the hardware file, the model or a layout file and the engine registry, plan,
and render the plan's document (written to ``--output`` when asked). Planning itself
(``moetune.plan``) stays pure; reading the files is ``moetune.planfiles``, shared with `tune`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.engine.facts import EngineFacts
from moetune.engine.launchspec import check_process_name
from moetune.errors import InputError
from moetune.hardware import inventory
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile, open_model
from moetune.plan.attention import Choose
from moetune.plan.plan import Plan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.planfiles import absolute, document, layout_services, model_path, plan_facts, read_inputs, routing_for

if TYPE_CHECKING:
    from moetune.run.verify import Verification


@dataclass(frozen=True, slots=True, kw_only=True)
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
    verify: bool = False  # also run the engine's own dry run of each service: :func:`verify`, after planning


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """What `moetune plan` made: the plan, its JSON document, and what to tell before it."""

    plan: Plan
    doc: dict[str, Any]  # the plan's JSON document (engine.command.plan_json)
    notices: list[tuple[str, str]]  # (message, remedy) to tell before the plan: what the hardware file allows
    verified: list[Verification] | None = None  # the engine's own dry run of each service (`plan --verify`)


def speed_overrides(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep:
            raise InputError(f"--speed {v!r}: expected NAME=VALUE")
        out[k.strip()] = val.strip()
    return out


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


def plan(req: PlanRequest) -> Planned:
    """Read the files, plan, render the document (and write it to ``req.output``)."""
    if req.verify and req.recipe is not None:
        raise InputError(
            "--verify runs the engine on the model's file, and a --recipe's output is not written yet",
            hint="quantize it first (`moetune quantize`), then plan the written file with --verify",
        )
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
        services, given = layout_services(req.layout, base, base_port=req.port, engine=engine, kind=kind)
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
    doc = document(p, engine, calib=inputs.calib, given=given, facts=facts)
    if req.output:
        req.output.write_text(json.dumps(doc, indent=2))
    return Planned(plan=p, doc=doc, notices=notices)


def verify(planned: Planned, output: Path | None = None) -> Planned:
    """The plan with the engine's own dry run of each service's exact command beside it (in the
    document's ``verify``, written again to ``output``): the plan's RPC workers must be listening."""
    from moetune.run.verify import verify_json, verify_plan

    vs = verify_plan(planned.plan.services, [sj["argv"] for sj in planned.doc["services"]])
    doc = {**planned.doc, "verify": verify_json(vs)}
    if output:
        output.write_text(json.dumps(doc, indent=2))
    return replace(planned, doc=doc, verified=vs)
