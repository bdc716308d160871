"""Snapshots in the Prometheus text format, read back with Prometheus' own Python parser; and
llama-server's /metrics text parsed (table-tested)."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from moetune.monitor import exposition
from moetune.monitor.exposition import (
    BY_NAME,
    METRICS,
    LabelledSnapshot,
    format_value,
    parse_text,
    render,
    series_key,
    split_key,
)
from moetune.monitor.snapshot import GpuSample, HostSample, ProcSample, Snapshot

FULL = Snapshot(
    t=1_700_000_000.25,
    host=HostSample(
        cpu_pct=(50.0, 12.5), mem_total_bytes=64 << 30, mem_used_bytes=20 << 30, mlocked_bytes=1 << 30, load1=1.5
    ),
    procs=(
        ProcSample(
            name="main",
            role="server",
            node="local",
            pid=100,
            cpu_pct=250.0,
            rss_bytes=3 << 30,
            threads=9,
            minflt=70,
            majflt=7,
        ),
        ProcSample(
            name="rpc-b", role="rpc", node="node-b", pid=200, cpu_pct=None, rss_bytes=None, threads=None, alive=False
        ),
    ),
    gpus=(
        GpuSample(
            index=0,
            name="NVIDIA H200",
            util_pct=87.5,
            mem_used_bytes=100 << 30,
            mem_total_bytes=141 << 30,
            power_w=412.5,
            pcie_rx_bytes_per_s=2.5e10,
            pcie_tx_bytes_per_s=1e6,
        ),
    ),
    servers={
        "main": {
            "llamacpp:prompt_tokens_total": 512.0,
            "llamacpp:tokens_predicted_total": 64.0,
            "llamacpp:requests_processing": 2.0,
            "llamacpp:requests_deferred": 1.0,
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 5.0,
            "llamacpp:some_new_gauge": 0.5,
        }
    },
    load={"requests_in_flight": 4.0, "requests_done_total": 120.0, "errors_total": 1.0, "level": 3.0},
    phase="c=4",
)


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """{family name: (type, [(sample name, labels, value)])} as prometheus_client reads the text."""
    return {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples]) for f in text_string_to_metric_families(text)
    }


def one(
    fams: dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]], name: str, **labels: str
) -> tuple[str, dict[str, str], float]:
    family = name.removesuffix("_total")
    hits = [s for s in fams[family][1] if s[0] == name and all(s[1].get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, fams[family])
    return hits[0]


def test_a_full_snapshot_renders_every_family_with_its_type_labels_and_value() -> None:
    text = render([LabelledSnapshot(snapshot=FULL, run=7, kind="serve-bench", label="glm", launch="20250101-abc")])
    fams = families(text)
    base = {"run": "7", "launch": "20250101-abc"}
    expected = [  # name, own labels, value
        ("moetune_snapshot_timestamp_seconds", {"node": "local"}, 1_700_000_000.25),
        ("moetune_run_info", {"kind": "serve-bench", "label": "glm", "phase": "c=4"}, 1),
        ("moetune_host_cpu_busy_ratio", {"node": "local", "cpu": "0"}, 0.5),
        ("moetune_host_cpu_busy_ratio", {"node": "local", "cpu": "1"}, 0.125),
        ("moetune_host_memory_total_bytes", {"node": "local"}, 64 << 30),
        ("moetune_host_memory_used_bytes", {"node": "local"}, 20 << 30),
        ("moetune_host_mlocked_bytes", {"node": "local"}, 1 << 30),
        ("moetune_host_load1", {"node": "local"}, 1.5),
        ("moetune_process_up", {"process": "main", "role": "server", "node": "local"}, 1),
        ("moetune_process_up", {"process": "rpc-b", "role": "rpc", "node": "node-b"}, 0),
        ("moetune_process_cpu_ratio", {"process": "main", "role": "server", "node": "local"}, 2.5),
        ("moetune_process_resident_memory_bytes", {"process": "main", "role": "server", "node": "local"}, 3 << 30),
        ("moetune_process_threads", {"process": "main", "role": "server", "node": "local"}, 9),
        ("moetune_process_major_page_faults_total", {"process": "main", "role": "server", "node": "local"}, 7),
        ("moetune_process_minor_page_faults_total", {"process": "main", "role": "server", "node": "local"}, 70),
        ("moetune_gpu_utilization_ratio", {"node": "local", "device": "0", "device_name": "NVIDIA H200"}, 0.875),
        ("moetune_gpu_memory_used_bytes", {"device": "0"}, 100 << 30),
        ("moetune_gpu_memory_total_bytes", {"device": "0"}, 141 << 30),
        ("moetune_gpu_power_watts", {"device": "0"}, 412.5),
        ("moetune_gpu_pcie_rx_bytes_per_second", {"device": "0"}, 2.5e10),
        ("moetune_gpu_pcie_tx_bytes_per_second", {"device": "0"}, 1e6),
        ("moetune_server_prompt_tokens_total", {"service": "main"}, 512),
        ("moetune_server_tokens_predicted_total", {"service": "main"}, 64),
        ("moetune_server_requests_processing", {"service": "main"}, 2),
        ("moetune_server_requests_deferred", {"service": "main"}, 1),
        ("moetune_server_spec_decode_num_accepted_tokens_per_pos_total", {"service": "main", "position": "1"}, 5),
        ("moetune_server_some_new_gauge", {"service": "main"}, 0.5),
        ("moetune_load_requests_in_flight", {}, 4),
        ("moetune_load_requests_done_total", {}, 120),
        ("moetune_load_errors_total", {}, 1),
        ("moetune_load_level", {}, 3),
    ]
    for name, own, value in expected:
        _, labels, got = one(fams, name, **own)
        assert got == pytest.approx(value), name
        assert {k: labels[k] for k in base} == base, name
    types = {name: t for name, (t, _) in fams.items()}
    for m in METRICS:
        if m.name.removesuffix("_total") in types:
            assert types[m.name.removesuffix("_total")] == m.type, m.name
    assert types["moetune_server_spec_decode_num_accepted_tokens_per_pos"] == "counter"
    assert types["moetune_server_some_new_gauge"] == types["moetune_load_level"] == "gauge"
    # an exited process has no figures but its state
    assert not [
        s for f in fams.values() for s in f[1] if s[1].get("process") == "rpc-b" and s[0] != "moetune_process_up"
    ]


def test_one_family_block_per_name_with_help_and_type_first() -> None:
    items = [
        LabelledSnapshot(snapshot=FULL, run=1, kind="bench", label="a"),
        LabelledSnapshot(snapshot=FULL, run=2, kind="bench", label="b"),
    ]
    text = render(items)
    seen: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert lines[i + 1].startswith(f"# TYPE {name} ")
            seen.append(name)
        elif not line.startswith("#"):
            assert line.split("{")[0].split()[0] == seen[-1]
    assert len(seen) == len(set(seen))
    assert text.endswith("\n")
    # both runs' series, one block
    assert {s[1]["run"] for s in families(text)["moetune_host_memory_used_bytes"][1]} == {"1", "2"}


def test_values_that_are_none_are_left_out() -> None:
    text = render(
        [
            LabelledSnapshot(
                snapshot=Snapshot(
                    t=5.0,
                    procs=(ProcSample(name="main", role="server", node="local", pid=1),),
                    gpus=(GpuSample(index=0, name="g"),),
                )
            )
        ]
    )
    fams = families(text)
    assert set(fams) == {"moetune_snapshot_timestamp_seconds", "moetune_process_up"}
    # no run: no run label and no run_info; no launch label either
    assert fams["moetune_snapshot_timestamp_seconds"][1] == [
        ("moetune_snapshot_timestamp_seconds", {"node": "local"}, 5.0)
    ]


def test_label_values_are_escaped() -> None:
    nasty = 'say "hi"\nback\\slash'
    snap = Snapshot(t=1.0, procs=(ProcSample(name=nasty, role="server", node="local", pid=1, threads=3),), phase=nasty)
    text = render([LabelledSnapshot(snapshot=snap, run=3, kind="bench", label=nasty, launch=nasty)])
    assert r'label="say \"hi\"\nback\\slash"' in text
    assert "\nback" not in text.replace("\\nback", "")  # no raw newline inside a line
    fams = families(text)
    _, labels, _ = one(fams, "moetune_run_info")
    assert labels["label"] == labels["phase"] == labels["launch"] == nasty
    _, labels, value = one(fams, "moetune_process_threads")
    assert labels["process"] == nasty and value == 3


def test_a_series_two_items_write_is_written_once_the_first_items() -> None:
    a = Snapshot(t=1.0, host=HostSample(mem_used_bytes=1))
    b = Snapshot(t=2.0, host=HostSample(mem_used_bytes=2))
    text = render(
        [LabelledSnapshot(snapshot=a), LabelledSnapshot(snapshot=b), LabelledSnapshot(snapshot=b, node="other")]
    )
    samples = families(text)["moetune_host_memory_used_bytes"][1]
    assert sorted((s[1]["node"], s[2]) for s in samples) == [("local", 1), ("other", 2)]


def test_nothing_to_export_is_an_empty_exposition() -> None:
    assert render([]) == ""


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3, "3"),
        (3.0, "3"),
        (0.125, "0.125"),
        (1e300, "1e+300"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (2.0**60, "1.152921504606847e+18"),
        (-2.5, "-2.5"),
    ],
)
def test_values_are_written_as_prometheus_reads_them(value: float, text: str) -> None:
    assert format_value(value) == text
    back = float(text)
    assert (math.isnan(back) and math.isnan(value)) or back == pytest.approx(value)


def test_the_docstring_table_lists_exactly_the_defined_metrics() -> None:
    doc = exposition.__doc__ or ""
    rows = re.findall(r"^(moetune_\w+)\s+(gauge|counter)\s", doc, re.M)
    assert rows == [(m.name, m.type) for m in METRICS]
    assert all(m.name.startswith("moetune_") and (m.type == "counter") == m.name.endswith("_total") for m in METRICS)
    assert len(BY_NAME) == len(METRICS)


# ---- llama-server's /metrics ----------------------------------------------------------------------

LLAMA_SERVER = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2903.63
llamacpp:n_busy_slots_per_decode nan
llamacpp:predicted_tokens_seconds +Inf
llamacpp:kv_cache_usage_ratio 0.25 1700000000000
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 12
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3

garbage line without a value
llamacpp:bad_value abc
odd{a="x\\"y",b="line\\nbreak",} 1e3
"""


def test_llama_server_metrics_are_parsed_tolerantly() -> None:
    assert parse_text(LLAMA_SERVER) == {
        "llamacpp:prompt_tokens_total": 6886.0,
        "llamacpp:prompt_seconds_total": 2903.63,
        "llamacpp:kv_cache_usage_ratio": 0.25,
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 12.0,
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 3.0,
        'odd{a="x\\"y",b="line\\nbreak"}': 1000.0,
    }


@pytest.mark.parametrize(
    ("key", "name", "labels"),
    [
        ("llamacpp:requests_processing", "llamacpp:requests_processing", {}),
        ('m{b="2",a="1"}', "m", {"a": "1", "b": "2"}),
        ('m{a="q\\"uo\\nte\\\\"}', "m", {"a": 'q"uo\nte\\'}),
    ],
)
def test_series_keys_round_trip(key: str, name: str, labels: dict[str, str]) -> None:
    assert split_key(key) == (name, labels)
    assert split_key(series_key(name, labels)) == (name, labels)


def test_parsed_server_metrics_render_as_moetune_series() -> None:
    parsed = parse_text(LLAMA_SERVER)
    fams = families(render([LabelledSnapshot(snapshot=Snapshot(t=1.0, servers={"glm": parsed}))]))
    assert one(fams, "moetune_server_prompt_tokens_total", service="glm")[2] == 6886
    assert one(fams, "moetune_server_kv_cache_usage_ratio", service="glm")[2] == 0.25
    assert one(fams, "moetune_server_odd", service="glm")[1]["a"] == 'x"y'
