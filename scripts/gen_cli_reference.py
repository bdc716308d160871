"""Write docs/reference/cli.md from the click commands: every command's and subcommand's --help.

    python scripts/gen_cli_reference.py           # rewrite docs/reference/cli.md
    python scripts/gen_cli_reference.py --check   # exit 1 when the committed file is not current

The text is click's own help, rendered at a fixed width (100 columns, the CLI's own maximum) so
that it does not depend on the terminal; tests/test_docs.py checks the committed file is current.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moetune.cli import cli

OUT = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
WIDTH = 100

HEADER = """# CLI reference

Generated from the click commands by `python scripts/gen_cli_reference.py` (do not edit by hand:
`tests/test_docs.py` fails when this page and the commands disagree). Exit codes: 0 ok, 1 runtime
failure, 2 bad input or usage, 130 interrupted; `tune` exits 3 on a busy machine.
"""


def walk(cmd: click.Command, name: str, parent: click.Context | None) -> list[tuple[str, str]]:
    """(path, help text) of CMD and, for a group, of every subcommand, depth first in listing order."""
    # as click makes it (the command's context_settings, help option names inherited), without parsing
    ctx = cmd.make_context(
        name, [], parent=parent, resilient_parsing=True, terminal_width=WIDTH, max_content_width=WIDTH
    )
    path = ctx.command_path
    pages = [(path, cmd.get_help(ctx))]
    if isinstance(cmd, click.Group):
        for sub_name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                pages += walk(sub, sub_name, ctx)
    return pages


def render() -> str:
    pages = walk(cli, "moetune", None)
    toc = "\n".join(f"- [`{path}`](#{anchor(path)})" for path, _ in pages)
    body = "\n\n".join(f"## {path}\n\n```text\n{text.rstrip()}\n```" for path, text in pages)
    return f"{HEADER}\n{toc}\n\n{body}\n"


def anchor(path: str) -> str:
    """The id mkdocs' toc extension gives the heading PATH ("moetune serve-bench" -> moetune-serve-bench)."""
    return path.lower().replace(" ", "-")


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is not current: run `python scripts/gen_cli_reference.py`", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
