"""`moetune record`: a recording proxy in front of an OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moetune.cli.common import json_option, print_json, warn

DEFAULT_LISTEN = "127.0.0.1:8090"


def _line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@click.command("record")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Address the proxy listens on (port 0: any free port). It has no authentication: keep it on "
    "loopback or a trusted network.",
)
@click.option(
    "--upstream", required=True, metavar="URL", help="The server to forward to, by its base URL: http://127.0.0.1:8080."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Session file, one JSON line per request [default: session-DATE-TIME.jsonl here].",
)
@click.option("--force", is_flag=True, help="Replace an existing session file.")
@click.option(
    "--redact",
    is_flag=True,
    help="Log message text, reasoning, tool-call arguments and prompts as "
    "same-length filler, so the file can be shared (what is sent and answered is not changed).",
)
@json_option
def record_cmd(listen: str, upstream: str, output: Path | None, force: bool, redact: bool, as_json: bool) -> None:
    """Forward requests to an OpenAI-compatible server and log each one, until Ctrl-C or SIGTERM.

    Point a client (an editor agent, a script) at the proxy's URL instead of the server's. Every
    request goes to the upstream unchanged and its answer comes back unchanged and unbuffered
    (streams event by event); each is appended to the session file when it ends: path, body,
    arrival time, timing, status, token counts, and the latency the proxy added. On exit it prints
    a summary (--json: as a document). Replay the file with `moetune serve-bench URL --replay FILE`.

    Exit codes: 0 when stopped by a signal, 1 when the port is in use, 2 for a bad --listen,
    --upstream or -o.
    """
    from moetune.bench.record.connections import Upstream
    from moetune.bench.record.proxy import RecordConfig, check_output, default_output, record
    from moetune.bench.record.session import summary_lines
    from moetune.monitor.serve import is_loopback, parse_listen

    host, port = parse_listen(listen)
    up = Upstream.parse(upstream)
    path = output or default_output()
    check_output(path, force=force)
    if not is_loopback(host):
        warn(
            f"--listen {listen}: the proxy has no authentication, and this address is not loopback: anyone who "
            f"reaches it can use {up.url} through it",
            "bind 127.0.0.1 unless the network is trusted",
        )

    def ready(url: str) -> None:
        _line(
            f"recording {url} -> {up.url} into {path}{' (redacted)' if redact else ''}: point the client at "
            f"{url}/v1 ; Ctrl-C to stop"
        )

    summary = record(
        RecordConfig(host=host, port=port, upstream=up, output=path, redact=redact), log=_line, ready=ready
    )
    _line(f"stopped; {path}: " + "\n".join(summary_lines(summary)))
    if as_json:
        print_json({"file": str(path), "upstream": up.url, "redacted": redact, **summary})


def register(cli: click.Group) -> None:
    cli.add_command(record_cmd)
