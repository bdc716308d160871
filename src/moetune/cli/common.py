"""What every command shares: error printing, --json output, consoles.

rich is imported on first use: ``out`` and ``err`` are created when a command first touches them,
so `moetune --help` and `--json` output never load it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from moetune.errors import MoetuneError, one_line

if TYPE_CHECKING:
    from rich.console import Console

    out: Console  # results: stdout
    err: Console  # progress, warnings, errors: stderr

F = TypeVar("F", bound=Callable[..., Any])


@cache
def console(stderr: bool) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name in ("out", "err"):
            return console(stderr=name == "err")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")(f)


def remote_options(f: F) -> F:
    """``--hf OWNER/REPO[:QUANT]`` and ``--http-timeout``: a model read over HTTP (headers only)."""
    f = click.option(
        "--http-timeout",
        "http_timeout_s",
        type=click.FloatRange(0.1, 3600),
        default=30.0,
        show_default=True,
        help="Seconds to wait for each HTTP answer (a URL or --hf model).",
    )(f)
    return click.option(
        "--hf",
        "hf",
        metavar="OWNER/REPO[:QUANT]",
        help="A model in a Hugging Face-style repository (HF_ENDPOINT, HF_TOKEN): QUANT is a "
        "directory, a file or a quant tag; only the headers are fetched.",
    )(f)


def remote_notes(p: Any, *, fetched: bool = False) -> None:
    """Say (on stderr) what a server did not do for a remote model (a ``ModelProfile`` with
    ``remote``), and with ``fetched`` what reading its headers cost."""
    r = p.remote
    if r is None:
        return
    if fetched:
        sys.stderr.write(
            f"{p.files[0]}: {r.fetched_text()} (headers of {len(p.files)} file{'s' if len(p.files) > 1 else ''})\n"
        )
    if r.range_ignored:
        n = len(r.range_ignored)
        warn(
            f"{r.range_ignored[0]}{f' (and {n - 1} more files)' if n > 1 else ''}: the server ignores Range requests; "
            f"each header was read from the start of the whole file and the connection closed after it (nothing "
            "more was downloaded)",
            "serve the files from a server with range support to read only what is needed",
        )


def plan_options(f: F) -> F:
    """The options of a plan (`plan`, `tune`): the hardware, the strategy, the engine, the port, and
    the settings that :class:`moetune.app.plan_options.PlanOptions` reads (``PlanOptions(**kw)``)."""
    opts = [
        click.option(
            "--hw", "hw_path", help="Hardware YAML, or a built-in example name (moetune hw example).  [required]"
        ),
        click.option(
            "--strategy",
            default="auto",
            show_default=True,
            help="auto | cpu-moe | all-gpu | n-cpu-moe:N | head-tail:H+T[+M] | layers:CUDA0=3-14,CUDA1=68-77",
        ),
        click.option(
            "--ctx", type=int, default=4096, show_default=True, help="Total context (-c), shared by the slots."
        ),
        click.option("--parallel", type=int, default=1, show_default=True),
        click.option("-b", "--batch", type=int, default=2048, show_default=True),
        click.option("-ub", "--ubatch", type=int, default=512, show_default=True),
        click.option(
            "--ctk",
            help="K cache type (f16 | q8_0 | q4_0; default: `plan` picks f16 or q8_0 by the speed "
            "model, `tune` starts from f16).",
        ),
        click.option("--ctv", help="V cache type (as --ctk; a quantized V needs flash attention)."),
        click.option(
            "--flash-attn",
            "flash_attn",
            type=click.Choice(["on", "off", "auto"]),
            default="auto",
            show_default=True,
            help="auto: `plan` picks what the speed model predicts faster at the plan's "
            "context (`tune` starts from on).",
        ),
        click.option("--no-flash-attn", is_flag=True, help="The same as --flash-attn off."),
        click.option(
            "--repack",
            type=click.Choice(["auto", "on", "off"]),
            default="auto",
            show_default=True,
            envvar="MOETUNE_REPACK",
            show_envvar=True,
            help="CPU weight repacking: auto follows the engine (mainline repacks CPU-resident weights, "
            "ik_llama.cpp only with -rtr); off where the engine crashes at load with repacked weights.",
        ),
        click.option(
            "--no-mmap", is_flag=True, help="Load weights into (pinned, with a GPU) memory instead of mapping the file."
        ),
        click.option(
            "--engine", "engine_name", help="Engine name (moetune engine list) or kind: llama.cpp | ik_llama.cpp."
        ),
        click.option("--amb", type=int, default=0, help="ik_llama.cpp -amb MiB (attention max batch)."),
        click.option("-t", "--threads", type=click.IntRange(1, 1024), help="CPU threads for llama-server (-t)."),
        click.option("--port", type=int, default=8080, show_default=True),
        click.option(
            "--routing",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="IMATRIX.gguf",
            help="Measured expert routing (llama-imatrix's GGUF output): how often each expert is chosen, "
            "for the share of experts a prefill batch touches (else every expert alike).",
        ),
        click.option(
            "-tb",
            "--threads-batch",
            type=click.IntRange(1, 1024),
            help="CPU threads for prefill (-tb; default: the engine's, the same as -t).",
        ),
        click.option("--merge-qkv", is_flag=True, help="ik_llama.cpp: merge Q, K and V into one tensor at load."),
        click.option("--muge", is_flag=True, help="ik_llama.cpp -muge: merge each layer's up and gate experts."),
        click.option("--ger", is_flag=True, help="ik_llama.cpp -ger: grouped expert routing."),
        click.option("--warmup-batch", is_flag=True, help="ik_llama.cpp: warm up with a whole batch."),
        click.option("--alias", help="The model's name in the server's API (-a)."),
        click.option(
            "--thinking",
            type=click.Choice(["on", "off"]),
            help="The server's default for requests that do not say (--reasoning-budget -1 | 0).",
        ),
        click.option(
            "--sampling",
            metavar="NAME=VALUE,...",
            help="The server's sampling defaults, e.g. temp=0.7,top_k=45,top_p=0.95,min_p=0.01.",
        ),
        click.option(
            "--rope-scaling",
            type=click.Choice(["yarn", "linear"]),
            help="Stretch positions past the model's trained context (--rope-scale follows --ctx per slot, "
            "--yarn-orig-ctx is the trained length).",
        ),
        click.option(
            "--ctx-checkpoints",
            type=click.IntRange(0, 4096),
            metavar="N",
            help="Context checkpoints each slot keeps (hybrid recurrent and sliding-window models; "
            "default: the engine's 32). The ledger counts their host RAM.",
        ),
        click.option(
            "--cache-ram",
            "cache_ram",
            type=click.IntRange(-1),
            metavar="MIB",
            help="Host RAM mainline's prompt cache may hold (-1 no limit, 0 none; default: the engine's "
            "8192 where the host has it left, else what is left). The ledger counts it.",
        ),
        click.option(
            "--split-mode",
            type=click.Choice(["layer", "graph"]),
            default="layer",
            show_default=True,
            help="graph (ik_llama.cpp, two or more GPUs): divide every offloaded layer across the GPUs "
            "(-sm graph) instead of giving each layer to one.",
        ),
        click.option(
            "--engine-arg",
            "engine_args",
            multiple=True,
            metavar="ARG",
            help="An extra argument for llama-server, repeatable, checked against the engine "
            "(--engine-arg=--no-warmup). Flags moetune sets from the plan are refused.",
        ),
        click.option(
            "--listen",
            metavar="ADDR[:PORT]",
            help="Where the server listens (default 127.0.0.1 and --port). Another address makes it "
            "reachable from the network: say it on purpose, with --api-key-file.",
        ),
        click.option(
            "--api-key-file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="A file of API keys (one per line) the server requires; moetune's own clients send the "
            "first. The plan keeps the path, never the key.",
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def require_hw(hw_path: str | None) -> None:
    if hw_path is None:
        from moetune.errors import InputError

        raise InputError(
            "missing option --hw: the hardware to plan for",
            hint="`moetune hw probe -o hw.yaml` describes this machine; `moetune hw example` lists "
            "ready-made ones (--hw rtx-pro-6000x2)",
        )


TRANSPORTS = ("tcp", "rdma", "auto")  # moetune.kinds.Transport's values (not imported: --help stays light)
TRANSPORT_HELP = (
    "RPC transport of a plan's workers: tcp (RDMA switched off where the build has it; the default), "
    "rdma (refused before anything starts unless the builds have it), auto (the build decides). "
    "The one used is read from each worker's log and stored with the run."
)


def transport_options(*, several: bool = False, what: str = "") -> Callable[[F], F]:
    """``--transport`` and ``--rdma-dev``, the same on every command that launches a plan
    (``launch``, ``bench``, ``sweep``, ``serve-bench``, ``tune``). With ``several``, a comma list
    (a tuple comes back; None when not given), else one value (a string, or None)."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        items = [x.strip().lower() for x in value.split(",") if x.strip()]
        bad = [x for x in items if x not in TRANSPORTS]
        if bad or not items:
            raise click.BadParameter(
                f"{value!r}: choose {', '.join(TRANSPORTS)}" + (" (a comma list)" if several else "")
            )
        if not several:
            if len(items) > 1:
                raise click.BadParameter(f"{value!r}: one transport here" + (f" ({what})" if what else ""))
            return items[0]
        return tuple(dict.fromkeys(items))

    def deco(f: F) -> F:
        f = click.option(
            "--rdma-dev", metavar="DEV", help="RoCE device for --transport rdma (GGML_RDMA_DEV), e.g. rocep1s0f1."
        )(f)
        return click.option(
            "--transport",
            metavar="tcp|rdma|auto" + (",..." if several else ""),
            callback=parse,
            help=TRANSPORT_HELP
            + (
                " A comma list measures each plan with each transport (labels 'PLAN (tcp)', 'PLAN (rdma)')."
                if several
                else ""
            ),
        )(f)

    return deco


def db_option(f: F) -> F:
    """``--db PATH``: the results database, for every command that reads or writes the history."""
    return click.option(
        "--db",
        "db_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Results database (default: results.sqlite in moetune's data directory).",
    )(f)


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_text(text: str) -> None:
    """Text a user runs or pastes (a script, a configuration), written exactly: no wrapping, tab
    expansion or control-character stripping by the console."""
    sys.stdout.write(text)
    sys.stdout.flush()


def warn(message: str, remedy: str | None = None) -> None:
    if not sys.stderr.isatty():  # a log or a pipe: plain lines, and no need to load rich
        sys.stderr.write(f"warning: {message}\n" + (f"  → {remedy}\n" if remedy else ""))
        return
    from rich.text import Text

    err = console(stderr=True)
    err.print(Text.assemble(("warning: ", "yellow"), message))
    if remedy:
        err.print(Text("  → " + remedy, style="dim"))


def run(group: click.Group) -> int:
    """Run the click group; print moetune errors as one line (plus a hint), never a traceback."""
    try:
        group.main(standalone_mode=False)
    except MoetuneError as e:
        from rich.text import Text

        err = console(stderr=True)
        # one line, whatever the message quotes (a path or a name with a line break in it)
        err.print(Text.assemble(("Error: ", "red"), one_line(str(e), None)))
        if e.hint:
            err.print(Text("  hint: " + one_line(e.hint, None), style="dim"))
        for line in e.details:
            err.print(Text("  " + line, style="dim"))
        return e.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        console(stderr=True).print("interrupted")
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    return 0


WIDE = 200  # columns for tables written to files and pipes


def print_wide(r: Any) -> None:
    """Tables at their natural width when stdout is a file or pipe (rich would fold them to 80 columns)."""
    out = console(stderr=False)
    if out.is_terminal:
        out.print(r)
    else:
        from rich.console import Console

        Console(width=WIDE, highlight=False, soft_wrap=True).print(r)


def comparison_output(
    c: Any, fmt: str, views: tuple[Callable[[Any], str], Callable[[Any], str], Callable[[Any], Any]] | None = None
) -> None:
    """A comparison (``moetune.report.compare.Comparison``, or anything with ``notes`` and its own
    ``views``: Markdown, CSV, table) as a table, Markdown or CSV, then its notes."""
    if views is None:
        from moetune.report.compare_view import comparison_csv, comparison_markdown, comparison_table

        views = (comparison_markdown, comparison_csv, comparison_table)
    markdown, csv, table = views
    if fmt == "md":
        sys.stdout.write(markdown(c))
    elif fmt == "csv":
        sys.stdout.write(csv(c))
    else:
        print_wide(table(c))
    for n in c.notes:
        warn(n)
