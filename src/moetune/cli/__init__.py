"""The `moetune` command: thin wrappers that parse, call the pipeline stages, and print.

The group is lazy: :data:`COMMANDS` names each subcommand, the module under ``moetune.cli`` that
defines it and its one-line help, so `moetune --help` imports no command module, and `moetune CMD`
imports only CMD's. Each module hands its commands over with ``register(group)``; the short help
shown in the listing is the table's, set on the command when it is loaded, so the listing is the
same whether a command was loaded or not. tests/test_cli_registry.py checks every module registers
exactly the names the table gives it.

Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

import click

from moetune import __version__
from moetune.cli.common import run


class Entry(NamedTuple):
    module: str  # under moetune.cli
    short_help: str


COMMANDS: dict[str, Entry] = {
    "inspect": Entry("model_cmds", "Show a GGUF model's tensors, layers, sizes and KV cache cost."),
    "testmodel": Entry("model_cmds", "Write a random-weight MoE model, or a sparse replica to plan."),
    "quantize": Entry("quant_cmds", "Quantize a model with a per-tensor recipe; its size predicted first."),
    "engine": Entry("engine_cmds", "Build, list and register engines (llama.cpp, ik_llama.cpp)."),
    "plan": Entry("plan_cmds", "Place a model on the hardware: memory, layers, speed, command."),
    "hw": Entry("plan_cmds", "Describe the hardware: probe this machine or use an example."),
    "launch": Entry("run_cmds", "Start a plan's RPC workers, then its servers."),
    "ps": Entry("run_cmds", "Launches with live processes (their pids checked now)."),
    "stop": Entry("run_cmds", "Stop launches: servers first, then RPC workers."),
    "doctor": Entry("doctor_cmds", "List problems in llama.cpp / ik_llama.cpp logs, with evidence."),
    "bench": Entry("bench_cmds", "Single-stream PP/TG of a running server or a plan."),
    "sweep": Entry("bench_cmds", "Launch, bench and stop each plan in turn, then compare them."),
    "serve-bench": Entry("serve_cmds", "Concurrent streaming load on a server: TTFT, ITL, throughput."),
    "serve-report": Entry("serve_cmds", "Figures of a stored serve-bench run."),
    "record": Entry("record_cmds", "A proxy that logs a client's requests to a server, for serve-bench --replay."),
    "results": Entry("results_cmds", "The history of benchmark runs: list, show, export."),
    "compare": Entry("results_cmds", "Compare runs with a baseline: medians, intervals, change in %."),
    "report": Entry("report_cmds", "One self-contained HTML page of a plan, its runs and their comparison."),
    "quality": Entry(
        "quality_cmds", "Does a plan change the answers? KLD against a reference, or a multiple-choice soak."
    ),
    "calibrate": Entry("calibrate_cmds", "Fit the speed model to benchmarks of plans; plan uses the fit."),
    "tune": Entry("tune_cmds", "Search for the fastest plan in a budget of launches, measured."),
    "link-test": Entry("cluster_cmds", "Bandwidth and latency from one node to another's link address."),
    "metrics": Entry("metrics_cmds", "Export the machine's figures to Prometheus; a Grafana dashboard for them."),
}


# environment variables moetune reads (shown under `moetune --help`)
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("MOETUNE_DATA_DIR", "results database, registered engines, run directories (default: the user data directory)"),
    ("MOETUNE_CACHE_DIR", "engine builds and downloads (default: the user cache directory)"),
    ("MOETUNE_ENGINE", "the engine used when a command gets no --engine (default: moetune's own build)"),
    ("MOETUNE_SSH_COMMAND", "replaces `ssh` for nodes of a hardware file, as GIT_SSH_COMMAND does for git"),
    ("MOETUNE_METRICS_INTERVAL", "seconds between samples of the machine during launches and runs (default 1; 0: off)"),
    (
        "MOETUNE_MAX_FOREIGN_CORES",
        "other programs' CPU load (cores averaged over a run, or N% of the machine) "
        "above which a run is contended and tune stops (default 0.5; off: never)",
    ),
    (
        "MOETUNE_NOISY_PCT",
        "a run whose 95% interval of TG or PP is wider than +/- this % of its median is noisy (default 10)",
    ),
    ("MOETUNE_PYPI_SIMPLE", "the package index `engine install` downloads from (default: https://pypi.org/simple)"),
)


def load_module_commands(module: str) -> dict[str, click.Command]:
    """Import ``moetune.cli.MODULE`` and return the commands its ``register`` hands over, by name."""
    mod = importlib.import_module(f"moetune.cli.{module}")
    scratch = click.Group()
    mod.register(scratch)
    return dict(scratch.commands)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (see the module docstring)."""

    def __init__(
        self, *args: object, table: dict[str, Entry], environment: tuple[tuple[str, str], ...] = (), **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.table = table
        self.environment = environment

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.table)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.table:
            entry = self.table[cmd_name]
            cmd = load_module_commands(entry.module).get(cmd_name)
            if cmd is None:
                raise RuntimeError(f"moetune.cli.{entry.module} registers no command {cmd_name!r}")
            cmd.short_help = entry.short_help
            self.add_command(cmd, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing from the table alone: `moetune --help` imports no command module."""
        rows = [(name, self.table[name].short_help) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.environment:
            with formatter.section("Environment"):
                formatter.write_dl(list(self.environment))
        super().format_epilog(ctx, formatter)


@click.group(
    cls=LazyGroup,
    table=COMMANDS,
    environment=ENVIRONMENT,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="moetune")
def cli() -> None:
    """Plan, launch, benchmark and tune huge Mixture-of-Experts models on llama.cpp."""


def main() -> None:
    sys.exit(run(cli))
