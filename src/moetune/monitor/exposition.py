"""Snapshots of the machine in Prometheus' text exposition format (version 0.0.4), and
llama-server's own ``/metrics`` text read back into numbers. Pure: no I/O, no clock.

:func:`render` writes one family block (``# HELP``, ``# TYPE``, its series) per metric name from a
list of :class:`LabelledSnapshot`. Every series of an item carries the item's ``run`` (a stored
run's id) and ``launch`` (a launch's run directory id) when they are known, then its own labels
below. A value the snapshot does not have (None) is left out; a series two items would both write
(same name, same labels) is written once, the first item's. The names are a public contract
(dashboards and alerts use them): add, never rename.

====================================================  =======  ============================  ==========================================
name                                                  type     labels (besides run, launch)  meaning
====================================================  =======  ============================  ==========================================
moetune_snapshot_timestamp_seconds                    gauge    node                          when the snapshot was taken (epoch s)
moetune_run_info                                      gauge    kind, label, phase            1 for a stored run being measured
moetune_host_cpu_busy_ratio                           gauge    node, cpu                     busy share of one core over the interval
moetune_host_memory_total_bytes                       gauge    node                          MemTotal
moetune_host_memory_used_bytes                        gauge    node                          MemTotal - MemAvailable
moetune_host_mlocked_bytes                            gauge    node                          Mlocked (pinned and mlock'ed pages)
moetune_host_load1                                    gauge    node                          1-minute load average
moetune_process_up                                    gauge    process, role, node           1 alive, 0 exited
moetune_process_cpu_ratio                             gauge    process, role, node           CPU used over the interval, 1.0 = one core
moetune_process_resident_memory_bytes                 gauge    process, role, node           resident set size
moetune_process_threads                               gauge    process, role, node           threads
moetune_process_major_page_faults_total               counter  process, role, node           major page faults (read from disk)
moetune_process_minor_page_faults_total               counter  process, role, node           minor page faults
moetune_process_gpu_memory_bytes                      gauge    process, role, node           its memory on GPUs (where NVML tells)
moetune_gpu_utilization_ratio                         gauge    node, device, device_name     busy share of the GPU (0-1)
moetune_gpu_memory_used_bytes                         gauge    node, device, device_name     GPU memory in use (all processes)
moetune_gpu_memory_total_bytes                        gauge    node, device, device_name     GPU memory
moetune_gpu_power_watts                               gauge    node, device, device_name     power draw
moetune_gpu_pcie_rx_bytes_per_second                  gauge    node, device, device_name     PCIe host-to-GPU traffic
moetune_gpu_pcie_tx_bytes_per_second                  gauge    node, device, device_name     PCIe GPU-to-host traffic
moetune_server_prompt_tokens_total                    counter  service                       prompt tokens processed (cache excluded)
moetune_server_prompt_tokens_cached_total             counter  service                       prompt tokens reused from the cache
moetune_server_prompt_seconds_total                   counter  service                       time spent on prompts
moetune_server_tokens_predicted_total                 counter  service                       tokens generated
moetune_server_tokens_predicted_seconds_total         counter  service                       time spent generating
moetune_server_n_decode_total                         counter  service                       llama_decode() calls
moetune_server_n_tokens_max                           gauge    service                       longest sequence seen
moetune_server_spec_decode_num_draft_tokens_total     counter  service                       speculative: draft tokens generated
moetune_server_spec_decode_num_accepted_tokens_total  counter  service                       speculative: draft tokens accepted
moetune_server_spec_decode_num_drafts_total           counter  service                       speculative: verification steps
moetune_server_prompt_tokens_seconds                  gauge    service                       server's average prompt tokens/s
moetune_server_predicted_tokens_seconds               gauge    service                       server's average generation tokens/s
moetune_server_requests_processing                    gauge    service                       requests in a slot
moetune_server_requests_deferred                      gauge    service                       requests waiting for a slot
moetune_server_n_busy_slots_per_decode                gauge    service                       average busy slots per decode
moetune_server_kv_cache_usage_ratio                   gauge    service                       KV cache in use (older builds, ik)
moetune_server_kv_cache_tokens                        gauge    service                       tokens in the KV cache (older builds, ik)
moetune_load_requests_in_flight                       gauge                                  benchmark requests sent, not yet done
moetune_load_requests_done_total                      counter                                benchmark requests completed
moetune_load_errors_total                             counter                                benchmark requests that failed
moetune_load_output_tokens_total                      counter                                tokens the benchmark received
moetune_load_ttft_recent_median_seconds               gauge                                  median TTFT of the last 32 requests
moetune_load_itl_recent_median_seconds                gauge                                  median ITL of the last 32 requests
====================================================  =======  ============================  ==========================================

Any other llama-server metric ``PREFIX:NAME{LABELS}``
(``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}``) is re-exported as
``moetune_server_NAME{service,LABELS}``, a counter when its name ends in ``_total`` and a gauge
otherwise; any other load figure ``KEY`` as ``moetune_load_KEY`` by the same rule. Characters a name cannot hold become ``_``. Ratios are 0-1 (a snapshot's percents /
100); ``node`` is ``local`` or the node's name in the hardware file; ``device`` is the GPU's index.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from moetune.monitor.snapshot import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "moetune_"


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    type: str  # gauge | counter
    labels: tuple[str, ...]  # its own, besides run and launch
    help: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelledSnapshot:
    """One snapshot and what it belongs to, as a source hands it to :func:`render`."""

    snapshot: Snapshot
    run: int | None = None  # the stored run it was taken for
    kind: str | None = None  # that run's kind and label (moetune_run_info)
    label: str | None = None
    launch: str | None = None  # the launch (run directory id) whose processes it watched
    node: str = "local"  # where its host and GPU figures were read


def _m(name: str, type_: str, labels: str, help_: str) -> Metric:
    return Metric(PREFIX + name, type_, tuple(labels.split()), help_)


_PROC = "process role node"
_GPU = "node device device_name"

METRICS: tuple[Metric, ...] = (
    _m("snapshot_timestamp_seconds", "gauge", "node", "When the snapshot was taken, seconds since the epoch."),
    _m(
        "run_info",
        "gauge",
        "kind label phase",
        "1 for each stored run being measured, with its kind, label and the benchmark's phase.",
    ),
    _m("host_cpu_busy_ratio", "gauge", "node cpu", "Busy share of one CPU core over the sampling interval (0-1)."),
    _m("host_memory_total_bytes", "gauge", "node", "Host memory (MemTotal)."),
    _m("host_memory_used_bytes", "gauge", "node", "Host memory in use (MemTotal - MemAvailable)."),
    _m("host_mlocked_bytes", "gauge", "node", "Host memory locked (Mlocked: pinned and mlock'ed pages)."),
    _m("host_load1", "gauge", "node", "Host load average over one minute."),
    _m("process_up", "gauge", _PROC, "1 while the engine process is alive, 0 once it has exited."),
    _m("process_cpu_ratio", "gauge", _PROC, "CPU the process used over the interval, in cores (1.0 = one core)."),
    _m("process_resident_memory_bytes", "gauge", _PROC, "Resident set size of the process."),
    _m("process_threads", "gauge", _PROC, "Threads of the process."),
    _m("process_major_page_faults_total", "counter", _PROC, "Major page faults of the process (pages read from disk)."),
    _m("process_minor_page_faults_total", "counter", _PROC, "Minor page faults of the process."),
    _m("process_gpu_memory_bytes", "gauge", _PROC, "The process's memory on GPUs, where NVML tells."),
    _m("gpu_utilization_ratio", "gauge", _GPU, "Busy share of the GPU over the interval (0-1)."),
    _m("gpu_memory_used_bytes", "gauge", _GPU, "GPU memory in use, all processes."),
    _m("gpu_memory_total_bytes", "gauge", _GPU, "GPU memory."),
    _m("gpu_power_watts", "gauge", _GPU, "GPU power draw."),
    _m("gpu_pcie_rx_bytes_per_second", "gauge", _GPU, "PCIe traffic from the host to the GPU."),
    _m("gpu_pcie_tx_bytes_per_second", "gauge", _GPU, "PCIe traffic from the GPU to the host."),
    _m(
        "server_prompt_tokens_total",
        "counter",
        "service",
        "llama-server: prompt tokens processed, cached ones excluded.",
    ),
    _m("server_prompt_tokens_cached_total", "counter", "service", "llama-server: prompt tokens reused from the cache."),
    _m("server_prompt_seconds_total", "counter", "service", "llama-server: time spent processing prompts."),
    _m("server_tokens_predicted_total", "counter", "service", "llama-server: tokens generated."),
    _m("server_tokens_predicted_seconds_total", "counter", "service", "llama-server: time spent generating."),
    _m("server_n_decode_total", "counter", "service", "llama-server: llama_decode() calls."),
    _m("server_n_tokens_max", "gauge", "service", "llama-server: longest sequence seen (prompt + generation)."),
    _m(
        "server_spec_decode_num_draft_tokens_total",
        "counter",
        "service",
        "llama-server: speculative decoding, draft tokens generated.",
    ),
    _m(
        "server_spec_decode_num_accepted_tokens_total",
        "counter",
        "service",
        "llama-server: speculative decoding, draft tokens accepted.",
    ),
    _m(
        "server_spec_decode_num_drafts_total",
        "counter",
        "service",
        "llama-server: speculative decoding, verification steps.",
    ),
    _m("server_prompt_tokens_seconds", "gauge", "service", "llama-server: its average prompt throughput, tokens/s."),
    _m(
        "server_predicted_tokens_seconds",
        "gauge",
        "service",
        "llama-server: its average generation throughput, tokens/s.",
    ),
    _m("server_requests_processing", "gauge", "service", "llama-server: requests being processed in a slot."),
    _m("server_requests_deferred", "gauge", "service", "llama-server: requests waiting for a slot."),
    _m("server_n_busy_slots_per_decode", "gauge", "service", "llama-server: average busy slots per llama_decode()."),
    _m(
        "server_kv_cache_usage_ratio",
        "gauge",
        "service",
        "llama-server: share of the KV cache in use (older builds and ik_llama.cpp).",
    ),
    _m(
        "server_kv_cache_tokens",
        "gauge",
        "service",
        "llama-server: tokens in the KV cache (older builds and ik_llama.cpp).",
    ),
    _m("load_requests_in_flight", "gauge", "", "Benchmark requests sent and not yet answered in full."),
    _m("load_requests_done_total", "counter", "", "Benchmark requests completed."),
    _m("load_errors_total", "counter", "", "Benchmark requests that failed."),
    _m("load_output_tokens_total", "counter", "", "Tokens the benchmark received."),
    _m(
        "load_ttft_recent_median_seconds",
        "gauge",
        "",
        "Median time to first token of the benchmark's last 32 requests.",
    ),
    _m(
        "load_itl_recent_median_seconds", "gauge", "", "Median inter-token latency of the benchmark's last 32 requests."
    ),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

_BAD_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def _dynamic(group: str, raw: str, labels: tuple[str, ...], origin: str) -> Metric:
    name = PREFIX + group + "_" + _BAD_NAME_CHAR.sub("_", raw)
    known = BY_NAME.get(name)
    if known is not None:
        return known
    return Metric(name, "counter" if name.endswith("_total") else "gauge", labels, origin)


def _server_metric(key: str) -> tuple[Metric, dict[str, str]]:
    name, labels = split_key(key)
    m = _dynamic(
        "server", name.rsplit(":", 1)[-1], ("service", *labels), f"llama-server's {name}, re-exported by moetune."
    )
    return m, {_BAD_NAME_CHAR.sub("_", k): v for k, v in labels.items()}


Series = tuple[Metric, dict[str, str], float]


def _series(item: LabelledSnapshot) -> Iterator[Series]:
    s, node = item.snapshot, item.node
    yield BY_NAME[PREFIX + "snapshot_timestamp_seconds"], {"node": node}, s.t
    if item.run is not None:
        yield (
            BY_NAME[PREFIX + "run_info"],
            {"kind": item.kind or "", "label": item.label or "", "phase": s.phase or ""},
            1.0,
        )

    def g(name: str, labels: dict[str, str], value: float | None, scale: float = 1.0) -> Iterator[Series]:
        if value is not None:
            yield BY_NAME[PREFIX + name], labels, value * scale

    h = s.host
    for i, pct in enumerate(h.cpu_pct or ()):
        yield from g("host_cpu_busy_ratio", {"node": node, "cpu": str(i)}, pct, 0.01)
    yield from g("host_memory_total_bytes", {"node": node}, h.mem_total_bytes)
    yield from g("host_memory_used_bytes", {"node": node}, h.mem_used_bytes)
    yield from g("host_mlocked_bytes", {"node": node}, h.mlocked_bytes)
    yield from g("host_load1", {"node": node}, h.load1)
    for p in s.procs:
        pl = {"process": p.name, "role": p.role, "node": p.node}
        yield from g("process_up", pl, 1.0 if p.alive else 0.0)
        yield from g("process_cpu_ratio", pl, p.cpu_pct, 0.01)
        yield from g("process_resident_memory_bytes", pl, p.rss_bytes)
        yield from g("process_threads", pl, p.threads)
        yield from g("process_major_page_faults_total", pl, p.majflt)
        yield from g("process_minor_page_faults_total", pl, p.minflt)
        yield from g("process_gpu_memory_bytes", pl, p.gpu_mem_bytes)
    for gpu in s.gpus:
        gl = {"node": node, "device": str(gpu.index), "device_name": gpu.name}
        yield from g("gpu_utilization_ratio", gl, gpu.util_pct, 0.01)
        yield from g("gpu_memory_used_bytes", gl, gpu.mem_used_bytes)
        yield from g("gpu_memory_total_bytes", gl, gpu.mem_total_bytes)
        yield from g("gpu_power_watts", gl, gpu.power_w)
        yield from g("gpu_pcie_rx_bytes_per_second", gl, gpu.pcie_rx_bytes_per_s)
        yield from g("gpu_pcie_tx_bytes_per_second", gl, gpu.pcie_tx_bytes_per_s)
    for service, values in s.servers.items():
        for key, value in values.items():
            m, own = _server_metric(key)
            yield m, {**own, "service": service}, value
    for key, value in s.load.items():
        yield _dynamic("load", key, (), f"The benchmark's load figure {key!r}."), {}, value


def render(items: Iterable[LabelledSnapshot]) -> str:
    """The exposition of these snapshots: families in the order of :data:`METRICS`, then the
    re-exported ones by name."""
    families: dict[str, tuple[Metric, list[str]]] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for item in items:
        scope = {
            k: v
            for k, v in (("run", None if item.run is None else str(item.run)), ("launch", item.launch))
            if v is not None
        }
        for metric, own, value in _series(item):
            labels = {**scope, **{k: v for k, v in own.items() if v != ""}}
            key = (metric.name, tuple(sorted(labels.items())))
            if key in seen:
                continue
            seen.add(key)
            fam = families.setdefault(metric.name, (metric, []))
            fam[1].append(f"{metric.name}{format_labels(labels)} {format_value(value)}")
    order = {m.name: i for i, m in enumerate(METRICS)}
    lines: list[str] = []
    for name in sorted(families, key=lambda n: (order.get(n, len(order)), n)):
        metric, samples = families[name]
        lines += [f"# HELP {name} {escape_help(metric.help)}", f"# TYPE {name} {metric.type}", *samples]
    return "".join(line + "\n" for line in lines)


def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items()) + "}"


def format_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


# ---- llama-server's /metrics, read -----------------------------------------------------------

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(v: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], v)


def _labels(body: str) -> dict[str, str] | None:
    out: dict[str, str] = {}
    pos = 0
    body = body.strip()
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if m is None:
            return None
        out[m[1]] = _unescape(m[2])
        pos = m.end()
    return out


def series_key(name: str, labels: Mapping[str, str]) -> str:
    """How :func:`parse_text` names a series: ``name``, or ``name{a="x",b="y"}`` (labels sorted)."""
    if not labels:
        return name
    return name + format_labels(dict(sorted(labels.items())))


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """The name and labels of a :func:`series_key` (a key it cannot read is a bare name)."""
    m = _SAMPLE.match(key + " 0")
    if m is None:
        return key, {}
    return m[1], (_labels(m[2]) or {}) if m[2] else {}


def parse_text(text: str) -> dict[str, float]:
    """The series of a Prometheus text exposition (llama-server's ``/metrics``), by
    :func:`series_key`: ``{"llamacpp:prompt_tokens_total": 6886.0, ...}``.

    Tolerant: comments, blank and unreadable lines are skipped, a timestamp after the value is
    ignored. Values that are not finite (NaN, ±Inf) are dropped: the history stores snapshots as
    strict JSON, and a NaN gauge says no more than an absent one."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = _labels(m[2]) if m[2] else {}
        if labels is None:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if math.isfinite(value):
            out[series_key(m[1], labels)] = value
    return out
