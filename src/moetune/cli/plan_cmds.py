"""`moetune plan` and `moetune hw probe|example|show`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from moetune.cli import common
from moetune.cli.common import (
    json_option,
    plan_options,
    print_json,
    remote_notes,
    remote_options,
    require_hw,
    warn,
)
from moetune.errors import InputError


@click.command()
@click.argument("model", required=False)
@remote_options
@click.option("--layout", type=click.Path(path_type=Path), help="Several services sharing the hardware (YAML).")
@plan_options
@click.option("--speed", "speed", multiple=True, metavar="NAME=VALUE", help="Override a speed-model constant.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "argv", "shell", "podman", "docker", "llama-swap"]),
    default="table",
    show_default=True,
    help="What to print besides the JSON.",
)
@click.option(
    "--image",
    help="Container image for --format podman/docker (default: the engine's image when it was "
    "registered with one, else ghcr.io/ggml-org/llama.cpp:server-cuda or ik_llama.cpp:latest; the flags "
    "always follow --engine).",
)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Also write the plan JSON to this file.")
@click.option(
    "--swa-full",
    is_flag=True,
    help="Sliding-window layers keep a cache of the whole context (llama.cpp's --swa-full), not of about a window.",
)
@click.option(
    "--recipe",
    "recipe",
    type=click.Path(path_type=Path),
    help="Plan the model this quant recipe "
    "(`moetune quantize --recipe`) makes of MODEL, without quantizing: its predicted tensor types and sizes.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Also run the engine's own dry run with each service's exact command "
    "(llama-fit-params; ik_llama.cpp's --dry-run) and print its figures beside the plan's.",
)
@json_option
def plan(
    model: str | None,
    hf: str | None,
    http_timeout_s: float,
    hw_path: str | None,
    layout: Path | None,
    strategy: str,
    engine_name: str | None,
    port: int,
    speed: tuple[str, ...],
    fmt: str,
    image: str | None,
    output: Path | None,
    swa_full: bool,
    recipe: Path | None,
    verify: bool,
    as_json: bool,
    **settings_kw: Any,
) -> None:
    """Place MODEL on the hardware: memory per device, layer map, predicted speed, exact command.

    MODEL is a GGUF file (any shard), an http(s) URL of one, or --hf OWNER/REPO[:QUANT]: a remote
    model is planned from its headers alone, before it is downloaded. Exits 0 whether or not the
    plan fits (it says so); 2 for unusable input. With --verify the engine on this machine
    allocates the plan itself, without loading weights (the plan's RPC workers must be listening),
    and any device where it disagrees with the plan is named.
    """
    from moetune.app.plan import PlanRequest, plan
    from moetune.app.plan import verify as verify_plan
    from moetune.app.plan_options import PlanOptions
    from moetune.engine.command import render_text

    require_hw(hw_path)
    assert hw_path is not None
    routing = settings_kw.pop("routing")
    opts = PlanOptions(**settings_kw)
    settings = replace(opts.settings(), swa_full=swa_full)
    planned = plan(
        PlanRequest(
            hw=hw_path,
            model=model,
            layout=layout,
            strategy=strategy,
            settings=settings,
            engine=engine_name,
            port=opts.port(port),
            speed=speed,
            output=output,
            hf=hf,
            http_timeout_s=http_timeout_s,
            routing=routing,
            recipe=recipe,
            choose=opts.choose(),
            verify=verify,
        )
    )
    for message, remedy in planned.notices:
        warn(message, remedy)
    for sp in planned.plan.services:
        remote_notes(sp.spec.model, fetched=True)
    if verify:
        with common.err.status("the engine's dry run", spinner="dots"):
            planned = verify_plan(planned, output)
    if as_json:
        print_json(planned.doc)
        return
    if fmt == "table":
        from moetune.report.plan_view import print_plan

        print_plan(planned.plan, planned.doc, common.out)
    else:
        from moetune.engine import registry

        images = {e.name: e.image for e in registry.load_user() if e.image}
        common.print_text(render_text(planned.plan, planned.doc, fmt, image=image, images=images))
    for w in planned.doc["warnings"]:
        warn(w["message"], w["remedy"])
    if planned.verified is not None:
        from moetune.report.plan_view import print_verify

        print_verify(planned.verified, common.out)


@click.group()
def hw() -> None:
    """Describe the hardware: probe this machine, or start from an example."""


@hw.command("probe")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the YAML here (default: stdout).")
@click.option("--measure/--no-measure", default=True, show_default=True, help="Measure RAM bandwidth (about a second).")
@json_option
def hw_probe(output: Path | None, measure: bool, as_json: bool) -> None:
    """Write a hardware YAML for this machine (NVML via nvidia-smi, /proc/meminfo, lscpu).

    A field nvidia-smi cannot give ([N/A], [Not Supported], missing) is a warning and an assumed
    value, never a failure; a unified-memory GPU (GB10) gets the shared memory less the CPU's share,
    and a discrete GPU whose size nvidia-smi cannot give is left out (the file stays valid).

    With --json the same document goes to stdout as JSON (and -o still writes the YAML).
    """
    import yaml

    from moetune.hardware import inventory
    from moetune.hardware.probe import probe

    notes: list[str] = []
    doc = inventory.to_dict(probe(measure=measure, notes=notes))
    for note in notes:
        warn(note, "check the values in the written file against the device's data sheet")
    text = yaml.safe_dump(doc, sort_keys=False)
    if output:
        output.write_text(text)
    if as_json:
        print_json(doc)
    elif output:
        common.out.print(f"wrote {output}")
    else:
        common.print_text(text)


@hw.command("attention")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--node", "node_name", help="The node whose CPU this machine is (default: the first).")
@click.option("--engine", "engine", help="The llama.cpp build whose kernels to measure (default: the built-in).")
@click.option("-t", "--threads", type=click.IntRange(1), help="Threads (default: the node's cores).")
@click.option(
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A GGUF to measure on (default: a generated MoE model, 60 MB; a small model of your family "
    "measures its head shapes).",
)
@click.option(
    "--depth", type=click.IntRange(64), default=2048, show_default=True, help="Context depth of the deep tests."
)
@click.option(
    "-r", "--repeats", type=click.IntRange(1), default=2, show_default=True, help="Samples per test in one launch."
)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Launches of each variant, interleaved; each test keeps its best.",
)
@click.option("--write", is_flag=True, help="Store the constants in the file's cpu.speed (the file is rewritten).")
@json_option
def hw_attention(
    path: Path,
    node_name: str | None,
    engine: str | None,
    threads: int | None,
    model: Path | None,
    depth: int,
    repeats: int,
    rounds: int,
    write: bool,
    as_json: bool,
) -> None:
    """Measure this CPU's attention kernels and fit the speed model's eight attention constants.

    llama-bench runs flash attention on and off with an f16 cache, and on with a q8_0 cache, at
    depth 0, --depth/2 and --depth, TG and PP, each variant launched --rounds times interleaved
    (about a minute on 2 cores); the speed model's own equations
    are fitted to the rows. These differ by CPU (on an AMX Xeon a q8_0 cache decodes faster than
    f16, on an AMD EPYC slower), and two calibration runs of one cache type cannot see them. With
    --write they go into the hardware file's cpu.speed, and every plan on it starts from them
    (over a stored calibration's values: they were measured alone); run it on the machine itself,
    quiet: it measures whatever else runs too.
    """
    from moetune.app.hw_attention import AttentionRequest, measure

    req = AttentionRequest(
        path=path,
        node=node_name,
        engine=engine,
        threads=threads,
        model=model,
        depth=depth,
        repeats=repeats,
        rounds=rounds,
        write=write,
    )
    with common.err.status("llama-bench", spinner="dots") as st:
        done = measure(req, warn=warn, progress=st.update)
    fitted, node, t = done.fitted, done.node, done.threads
    if as_json:
        print_json(done.to_json())
        return
    common.out.print(
        f"{node.name}: {t} threads, llama-bench (best of {rounds} launches x {repeats}), fitted:", markup=False
    )
    for r, (ptg, ppp) in zip(fitted.rows, fitted.predicted, strict=True):
        common.out.print(
            f"  {r.label:<12} depth {r.depth:>5}  TG {r.tg_tok_s:8.1f} (model {ptg:8.1f})  "
            f"PP {r.pp_tok_s:8.1f} (model {ppp:8.1f}) tok/s",
            markup=False,
        )
    common.out.print("cpu:\n  speed:", markup=False)
    for k, v in fitted.constants.items():
        common.out.print(f"    {k}: {v}", markup=False)
    common.out.print(f"written to {path}" if write else "(--write stores them in the file's cpu.speed)", markup=False)


@hw.command("example")
@click.argument("name", required=False)
@json_option
def hw_example(name: str | None, as_json: bool) -> None:
    """List the built-in hardware examples, or print one (--json: the names, or the example, as JSON)."""
    from moetune.hardware import inventory

    if not name:
        if as_json:
            print_json(inventory.examples())
            return
        for n in inventory.examples():
            common.out.print(n)
        return
    path = Path(inventory.__file__).parent / "examples" / f"{name}.yaml"
    if not path.exists():
        raise InputError(f"no example {name!r} (examples: {', '.join(inventory.examples())})")
    if as_json:
        import yaml

        print_json(yaml.safe_load(path.read_text()))
    else:
        common.print_text(path.read_text())


@hw.command("show")
@click.argument("path")
@json_option
def hw_show(path: str, as_json: bool) -> None:
    """Validate a hardware file and list the devices llama-server will see, in its order."""
    from moetune.hardware import inventory

    inv = inventory.load(path)
    rows = [
        {"name": d.name, "kind": d.kind, "mem_mib": d.mem_mib, "bw_gbs": d.bw_gbs, "node": d.node}
        for d in inv.devices()
    ]
    if as_json:
        print_json(rows)
        return
    for r in rows:
        common.out.print(
            f"{r['name']:<28} {r['kind']:<4} {r['mem_mib']:>10,.0f} MiB  {r['bw_gbs']:>7,.0f} GB/s  ({r['node']})",
            markup=False,
        )


def register(cli: click.Group) -> None:
    cli.add_command(plan)
    cli.add_command(hw)
