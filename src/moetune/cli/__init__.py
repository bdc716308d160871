"""The `moetune` command: thin wrappers that parse, call the pipeline stages, and print.

Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage, 130 interrupted.
"""

from __future__ import annotations

import sys

import click

from moetune import __version__
from moetune.cli import (
    bench_cmds,
    cluster_cmds,
    doctor_cmds,
    engine_cmds,
    model_cmds,
    plan_cmds,
    results_cmds,
    run_cmds,
    serve_cmds,
)
from moetune.cli.common import run


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="moetune")
def cli() -> None:
    """Plan, launch, benchmark and tune huge Mixture-of-Experts models on llama.cpp."""


for module in (model_cmds, engine_cmds, plan_cmds, run_cmds, doctor_cmds, bench_cmds, serve_cmds, results_cmds,
               cluster_cmds):
    module.register(cli)


def main() -> None:
    sys.exit(run(cli))
