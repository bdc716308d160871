"""A plan as commands: each service's llama-server argv, the plan's JSON document (``moetune plan
--json``, with the ``launch`` section `moetune launch` reads), and the other formats a user can ask
for (shell script, podman/docker, llama-swap). Pure: the same plan renders the same text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

from moetune.engine.dialect import Dialect, dialect, engine_devices, n_cpu_moe_note
from moetune.engine.facts import EngineFacts
from moetune.engine.formats import (
    Command,
    argv_lines,
    container_command,
    llama_swap_config,
    mount_labels,
    shell_script,
)
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.engine.render import defaults_argv, override_rules, server_argv
from moetune.jsonread import integer, mapping, mappings, strings
from moetune.kinds import DeviceKind, EngineKind, ProcessRole, StrategyKind
from moetune.plan.placement import parse_strategy
from moetune.plan.plan import Plan, ServicePlan

PLAN_SCHEMA_VERSION = 1
FORMATS = ("argv", "shell", "podman", "docker", "llama-swap")  # besides the table and the JSON
# --format podman|docker without --image: the engine's server image (mainline publishes its own; ik_llama.cpp's
# docker/ directory builds one, tagged here as its README's user would)
DEFAULT_IMAGES = {
    (EngineKind.MAINLINE, True): "ghcr.io/ggml-org/llama.cpp:server-cuda",
    (EngineKind.MAINLINE, False): "ghcr.io/ggml-org/llama.cpp:server",
    (EngineKind.IK, True): "ik_llama.cpp:latest",
    (EngineKind.IK, False): "ik_llama.cpp:latest",
}


# the facts of engine builds by engine name (engine.facts.probe); an engine not in it renders in
# the dialect of the build `moetune engine install` makes
Facts = Mapping[str, EngineFacts]


def service_dialect(sp: ServicePlan, facts: Facts | None = None) -> Dialect:
    return dialect(sp.spec.settings.engine, (facts or {}).get(sp.spec.engine or ""))


def service_argv(sp: ServicePlan, facts: Facts | None = None) -> list[str]:
    """The arguments after llama-server for one service of a plan."""
    spec = sp.spec
    # the devices as the engine names them: RPC devices numbered across the service's own endpoints
    names = sp.hw.engine_names()
    extra = ["--device", ",".join(names[d.name] for d in sp.hw.accelerators())] if spec.devices else []
    return server_argv(
        spec.model,
        sp.placement,
        spec.settings,
        service_dialect(sp, facts),
        engine=spec.engine or "",
        port=spec.port,
        rpc=sp.hw.rpc_endpoints(),
        extra=extra,
        accelerators=_accelerators(sp),
    )


def defaults_service_argv(sp: ServicePlan, facts: Facts | None = None) -> list[str]:
    """The service's engine with the model and no tuning flags (:func:`moetune.engine.render.defaults_argv`)."""
    return defaults_argv(
        sp.spec.model, sp.spec.settings, service_dialect(sp, facts), port=sp.spec.port, rpc=sp.hw.rpc_endpoints()
    )


def _accelerators(sp: ServicePlan) -> list[tuple[str, bool]]:
    return [(d.name, d.kind == DeviceKind.RPC) for d in sp.hw.accelerators()]


def service_notes(sp: ServicePlan, facts: Facts | None = None) -> list[str]:
    """What a user comparing with the engines' own flags should know: what ``--n-cpu-moe N`` would
    keep on the CPU in each engine (the service's own engine in its build's rule); why the plan
    chose its flash attention and cache type, where it chose them."""
    chosen = [] if sp.attention_note is None else [sp.attention_note]
    st = parse_strategy(sp.spec.strategy)
    graph = []
    if sp.spec.settings.split_mode == "graph":
        gpus = sorted({d for d in sp.placement.layer_device[: sp.spec.model.n_layer] if d in sp.memory.items} - {"CPU"})
        graph = [
            f"-sm graph: every layer on {' or '.join(gpus)} is divided across the GPUs by -ts "
            f"{','.join(map(str, sp.placement.tensor_split))} (the ledger's weights (split)); the layer map "
            "shows where each would sit in layer split"
        ]
    if st.kind != StrategyKind.N_CPU_MOE:
        return [*chosen, *graph]
    n = st.n
    own = service_dialect(sp, facts)
    dialects = [own, *(dialect(k) for k in EngineKind if k != own.kind)]
    devs = list(sp.placement.layer_device)
    notes = [
        n_cpu_moe_note(d, n, sp.spec.model.n_layer, devs, n_devices=len(engine_devices(d, _accelerators(sp))))
        for d in dialects
    ]
    return [*chosen, *graph, *notes, "rendered as explicit -ot overrides, which mean the same in every engine"]


def _layer_map(sp: ServicePlan) -> list[dict[str, object]]:
    ex = sp.placement.experts()
    by_layer: dict[int, dict[str, str]] = {}
    for t in sp.spec.model.tensors:
        if t.is_expert and t.layer is not None and t.name in ex:
            by_layer.setdefault(t.layer, {})[t.kind] = ex[t.name]
    out = []
    for layer in sp.spec.model.layers:
        if layer.index >= sp.spec.model.n_layer:
            continue
        out.append(
            {
                "index": layer.index,
                "kind": layer.kind,
                "device": sp.placement.layer_device[layer.index],
                "experts": by_layer.get(layer.index, {}),
                "expert_mib": round(layer.expert_bytes / (1 << 20), 2),
            }
        )
    return out


def service_json(sp: ServicePlan, argv: list[str], facts: Facts | None = None) -> dict[str, object]:
    return {
        "name": sp.spec.name,
        "model": str(sp.spec.model.files[0]),
        "arch": sp.spec.model.arch,
        "strategy": sp.placement.strategy,
        "settings": asdict(sp.spec.settings),
        "port": sp.spec.port,
        "devices": {
            dev: [{"what": i.what, "mib": round(i.mib, 2)} for i in items] for dev, items in sp.memory.items.items()
        },
        "kv_cells": sp.memory.kv_cells,
        **({"kv_cells_swa": sp.memory.swa_cells} if sp.memory.swa_cells else {}),
        **(
            {"dry_run_compute_mib": {d: round(v, 2) for d, v in sp.memory.dry_run_compute_mib.items()}}
            if sp.memory.dry_run_compute_mib
            else {}
        ),
        "cpu_mapped_span_mib": {f: round(v, 2) for f, v in sp.memory.mapped_span_mib.items()},
        "layers": _layer_map(sp),
        "tensor_split": list(sp.placement.tensor_split),
        "override_rules": [str(r) for r in override_rules(sp.spec.model, sp.placement)],
        "predicted": sp.prediction.to_json(),
        "argv": argv,
        "notes": service_notes(sp, facts),
        "engine_version": service_dialect(sp, facts).version,
        **({"remote": _remote_json(sp)} if sp.spec.model.remote else {}),
    }


def _remote_json(sp: ServicePlan) -> dict[str, object]:
    """A model planned from its URL: its files, where the commands expect it (-m) and how to get it there."""
    r = sp.spec.model.remote
    assert r is not None
    return {
        "files": [str(f) for f in sp.spec.model.files],
        "local_path": r.local_path,
        "download": r.download,
        "bytes_fetched": r.bytes_fetched,
        "requests": r.requests,
    }


def launch_spec(plan: Plan, engine: str, argvs: list[list[str]] | None = None) -> LaunchSpec:
    """The processes to start: an RPC worker per remote node with devices, then the servers."""
    argvs = argvs if argvs is not None else [service_argv(sp) for sp in plan.services]
    procs: list[ProcessSpec] = []
    workers: list[str] = []
    for i, n in enumerate(plan.hw.nodes[1:]):
        if not n.devices:
            continue
        name = f"rpc{i}"
        host = n.link_addr or "127.0.0.1"
        procs.append(
            ProcessSpec(
                name=name,
                role=ProcessRole.RPC,
                engine=engine,
                argv=("-H", host, "-p", str(n.rpc_port)),
                host=host,
                port=n.rpc_port,
                node=n.name,
                ssh=n.ssh,
                bin_dir=n.bin_dir,
                allow_public_bind=n.allow_public_bind,
            )
        )
        workers.append(name)
    for sp, argv in zip(plan.services, argvs, strict=True):
        procs.append(
            ProcessSpec(
                name=sp.spec.name,
                role=ProcessRole.SERVER,
                engine=sp.spec.engine or engine,
                argv=tuple(argv),
                host=sp.spec.settings.server.host,
                port=sp.spec.port,
                env=dict(sp.spec.settings.server.env),
                after=tuple(workers),
                gpus=service_gpus(sp),
            )
        )
    return LaunchSpec(tuple(procs))


def plan_json(
    plan: Plan,
    engine: str,
    binary: str = "llama-server",
    facts: Facts | None = None,
    *,
    argvs: list[list[str]] | None = None,
) -> dict[str, object]:
    """The plan's document: verdict, ledgers, prediction, commands and what to launch (in the
    dialect of each service's engine build, from ``facts``)."""
    argvs = argvs if argvs is not None else [service_argv(sp, facts) for sp in plan.services]
    main = plan.main
    return {
        "schema_version": PLAN_SCHEMA_VERSION,
        "fits": plan.fits,
        "devices": [
            {
                "name": led.device,
                "kind": led.kind,
                "capacity_mib": round(led.capacity_mib, 1),
                "used_mib": round(led.used_mib, 1),
                "free_mib": round(led.free_mib, 1),
                "items": [
                    {
                        "what": it.what,
                        "mib": round(it.mib, 2),
                        "service": it.service,
                        **({"note": it.note} if it.note else {}),
                    }
                    for it in led.items
                ],
            }
            for led in plan.ledgers
        ],
        "shortfalls": [sf.to_json() for sf in plan.shortfalls],
        "warnings": plan.warnings(),
        "predicted": {"tg_tok_s": round(main.prediction.tg_tok_s, 3), "pp_tok_s": round(main.prediction.pp_tok_s, 3)},
        "argv": [binary, *argvs[0]],
        "shell": shell_script(
            [
                Command(sp.spec.name, sp.spec.port, (binary, *argv), sp.spec.settings.server.env)
                for sp, argv in zip(plan.services, argvs, strict=True)
            ]
        ),
        "services": [service_json(sp, argv, facts) for sp, argv in zip(plan.services, argvs, strict=True)],
        "hardware": plan.hw.name or plan.hw.source,
        "speed_constants": main.prediction.to_json()["constants"],
        "launch": launch_spec(plan, engine, argvs).to_json(),
    }


def commands(doc: Mapping[str, object], binary: str = "llama-server") -> list[Command]:
    """Every service's command, from the plan's document."""

    def env(sj: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
        pairs = mapping(mapping(sj.get("settings")).get("server")).get("env", ())
        return tuple((str(k), str(v)) for k, v in pairs) if isinstance(pairs, list | tuple) else ()

    return [
        Command(str(sj["name"]), integer(sj["port"]), (binary, *strings(sj["argv"])), env(sj))
        for sj in mappings(doc["services"])
    ]


def service_gpus(sp: ServicePlan) -> tuple[str, ...]:
    """The local GPUs a service may use (its ``devices``, else all): what a container is given."""
    return tuple(d.name for d in sp.hw.local.devices if d.kind == DeviceKind.GPU)


def has_gpus(sp: ServicePlan) -> bool:
    return bool(service_gpus(sp))


def render_text(
    plan: Plan,
    doc: Mapping[str, object],
    fmt: str,
    image: str | None = None,
    *,
    images: Mapping[str, str] | None = None,
) -> str:
    """Every service's command in one of FORMATS (``doc`` is ``plan_json(plan, ...)``). A container's
    flags follow the engine the service is planned for, its image too unless ``image`` is given:
    the image of its engine (``images``, by engine name, for the engines registered with one), else
    the engine kind's published image."""
    cmds = commands(doc, strings(doc["argv"])[0])
    if fmt == "argv":
        return argv_lines(cmds)
    if fmt == "shell":
        return shell_script(cmds)
    if fmt in ("podman", "docker"):

        def image_of(sp: ServicePlan) -> str:
            own = (images or {}).get(sp.spec.engine)
            return image or own or DEFAULT_IMAGES[EngineKind(sp.spec.settings.engine), has_gpus(sp)]

        labels = mount_labels([c.argv for c in cmds])
        return shell_script(
            [
                container_command(fmt, image_of(sp), c, gpus=service_gpus(sp), label=label)
                for sp, c, label in zip(plan.services, cmds, labels, strict=True)
            ]
        )
    if fmt == "llama-swap":
        return llama_swap_config(cmds)
    raise ValueError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
