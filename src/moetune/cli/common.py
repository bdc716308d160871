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

from moetune.errors import MoetuneError

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
    f = click.option("--http-timeout", "http_timeout_s", type=click.FloatRange(0.1, 3600), default=30.0,
                     show_default=True, help="Seconds to wait for each HTTP answer (a URL or --hf model).")(f)
    return click.option("--hf", "hf", metavar="OWNER/REPO[:QUANT]",
                        help="A model in a Hugging Face-style repository (HF_ENDPOINT, HF_TOKEN): QUANT is a "
                        "directory, a file or a quant tag; only the headers are fetched.")(f)


def remote_notes(p: Any, *, fetched: bool = False) -> None:
    """Say (on stderr) what a server did not do for a remote model (a ``ModelProfile`` with
    ``remote``), and with ``fetched`` what reading its headers cost."""
    r = p.remote
    if r is None:
        return
    if fetched:
        sys.stderr.write(f"{p.files[0]}: {r.fetched_text()} (headers of {len(p.files)} file"
                         f"{'s' if len(p.files) > 1 else ''})\n")
    if r.range_ignored:
        n = len(r.range_ignored)
        warn(f"{r.range_ignored[0]}{f' (and {n - 1} more files)' if n > 1 else ''}: the server ignores Range requests; "
             f"each header was read from the start of the whole file and the connection closed after it (nothing "
             "more was downloaded)", "serve the files from a server with range support to read only what is needed")


def db_option(f: F) -> F:
    """``--db PATH``: the results database, for every command that reads or writes the history."""
    return click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path),
                        help="Results database (default: results.sqlite in moetune's data directory).")(f)


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
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
        err.print(Text.assemble(("Error: ", "red"), str(e)))
        if e.hint:
            err.print(Text("  hint: " + e.hint, style="dim"))
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


def comparison_output(c: Any, fmt: str) -> None:
    """A comparison (``moetune.report.compare.Comparison``) as a table, Markdown or CSV."""
    from moetune.report.compare_view import comparison_csv, comparison_markdown, comparison_table

    if fmt == "md":
        sys.stdout.write(comparison_markdown(c))
    elif fmt == "csv":
        sys.stdout.write(comparison_csv(c))
    else:
        print_wide(comparison_table(c))
    for n in c.notes:
        warn(n)
