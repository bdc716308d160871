"""Named kinds, one enum each, so that one word means one thing everywhere.

Each is a ``StrEnum`` whose values are the strings plan files, run records and JSON output have
always carried: ``EngineKind.IK == "ik_llama.cpp"``, and ``json.dumps`` writes the plain string.
Write YAML with ``str(kind)``: the safe dumper refuses str subclasses.
"""

from __future__ import annotations

from enum import StrEnum


class EngineKind(StrEnum):
    """Which engine family a build belongs to (its flag dialect, its quant types, its log era)."""

    MAINLINE = "llama.cpp"
    IK = "ik_llama.cpp"


class LogEra(StrEnum):
    """Which grammar a server log needs (one per era, not per engine)."""

    MAINLINE = "mainline"  # llama.cpp since about build 4400: "0.00.012.345 I load_tensors: ..."
    LEGACY = "legacy"  # ik_llama.cpp and older llama.cpp: "llm_load_tensors: ...", "llama_kv_cache_init: ..."


class DeviceKind(StrEnum):
    """What a device in a hardware file is (its name, such as ``CUDA0`` or ``CPU``, is another matter)."""

    GPU = "gpu"
    CPU = "cpu"
    RPC = "rpc"  # a device behind a llama.cpp RPC worker on another node


class StrategyKind(StrEnum):
    """Which family a placement strategy (``--strategy``) belongs to; the string's syntax is read by
    :func:`moetune.plan.placement.parse_strategy`."""

    AUTO = "auto"  # the planner fits the most it can on the accelerators
    CPU_MOE = "cpu-moe"  # every routed expert on the CPU
    ALL_GPU = "all-gpu"  # everything on the accelerators
    N_CPU_MOE = "n-cpu-moe"  # n-cpu-moe:N, the experts of the first N layers on the CPU
    LAYERS = "layers"  # layers:CUDA0=3-14,CUDA1=68-77, the experts of those layers on those devices
    HEAD_TAIL = "head-tail"  # head-tail:H+T[+M], the first H, last T (and M middle) MoE layers' experts

    @property
    def takes_argument(self) -> bool:
        """Whether the strategy is written ``KIND:ARGUMENT`` (otherwise the bare word)."""
        return self in (StrategyKind.N_CPU_MOE, StrategyKind.LAYERS, StrategyKind.HEAD_TAIL)


class ProcessRole(StrEnum):
    """What a process of a launch is."""

    SERVER = "server"  # llama-server
    RPC = "rpc"  # ggml-rpc-server, a worker a server uses as devices


class Transport(StrEnum):
    """How a server talks to its RPC workers (``moetune launch --transport``)."""

    TCP = "tcp"  # RDMA switched off where the build has it
    RDMA = "rdma"  # refused unless the builds have it
    AUTO = "auto"  # the build decides


class LaunchState(StrEnum):
    """Where a launch (a run directory) is in its life."""

    STARTING = "starting"
    HEALTHY = "healthy"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"
    EXITED = "exited"  # never written: what `ps` says of a starting or healthy run whose processes are gone


class LogPhase(StrEnum):
    """Load phases a server goes through, in order, as its log tells them."""

    STARTING = "starting"
    LOADING_MODEL = "loading model"
    FITTING = "fitting to memory"
    LOADING_TENSORS = "loading tensors"
    ALLOCATING_PINNED = "allocating pinned memory"
    CREATING_CONTEXT = "creating context"
    ALLOCATING_COMPUTE = "allocating compute buffers"
    WARMUP = "warm-up"
    READY = "ready"


# ---- the results history's kinds ------------------------------------------------------------


class RunKind(StrEnum):
    """What a stored run measured."""

    BENCH = "bench"  # single-stream PP/TG, also each plan of a sweep
    SERVE_BENCH = "serve-bench"  # concurrent load
    LINK_TEST = "link-test"  # bandwidth and latency between two nodes
    QUALITY = "quality"  # llama-perplexity: PPL of a plan, or its KLD and top-1 agreement against a reference
    QA = "qa"  # a multiple-choice soak against a server: one answer per question


class RunStatus(StrEnum):
    """Where a stored run is: its samples are kept whatever it ended as."""

    RUNNING = "running"  # being written, or its writer was killed
    DONE = "done"
    INTERRUPTED = "interrupted"  # Ctrl-C: its samples are complete
    FAILED = "failed"
