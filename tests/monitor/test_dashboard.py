"""The Grafana dashboard queries only what the exposition defines, and is a well-formed dashboard."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

from moetune.monitor.exposition import BY_NAME

DASHBOARD: dict[str, Any] = json.loads((files("moetune.monitor") / "grafana" / "moetune.json").read_text())


def exprs(doc: dict[str, Any]) -> Iterator[str]:
    for p in doc["panels"]:
        for t in p.get("targets", ()):
            yield t["expr"]
    for v in doc["templating"]["list"]:
        q = v.get("query")
        yield q["query"] if isinstance(q, dict) else str(q or "")


def test_every_metric_the_dashboard_queries_is_one_the_exposition_defines() -> None:
    used = {n for e in exprs(DASHBOARD) for n in re.findall(r"\bmoetune_\w+", e)}
    assert used, "the dashboard queries moetune's metrics"
    assert not used - set(BY_NAME), f"not defined by moetune.monitor.exposition: {sorted(used - set(BY_NAME))}"
    # the panels the dashboard promises
    for name in (
        "moetune_gpu_utilization_ratio",
        "moetune_gpu_memory_used_bytes",
        "moetune_gpu_power_watts",
        "moetune_process_cpu_ratio",
        "moetune_process_resident_memory_bytes",
        "moetune_host_cpu_busy_ratio",
        "moetune_host_memory_used_bytes",
        "moetune_server_tokens_predicted_total",
        "moetune_load_requests_in_flight",
        "moetune_load_errors_total",
    ):
        assert name in used, name


def test_counters_are_read_as_rates_and_only_counters_are() -> None:
    for e in exprs(DASHBOARD):
        for name in re.findall(r"\bmoetune_\w+", e):
            inside_rate = re.search(rf"\b(rate|increase)\(\s*{name}\b", e) is not None
            assert inside_rate == (BY_NAME[name].type == "counter"), e


def test_panels_filter_by_the_run_and_service_variables() -> None:
    names = [v["name"] for v in DASHBOARD["templating"]["list"]]
    assert names == ["datasource", "run", "service"]
    for p in DASHBOARD["panels"]:
        for t in p.get("targets", ()):
            assert 'run=~"$run"' in t["expr"], t["expr"]
            if "moetune_process_" in t["expr"]:
                assert 'process=~"$service"' in t["expr"]
            if "moetune_server_" in t["expr"]:
                assert 'service=~"$service"' in t["expr"]
            assert t["datasource"]["uid"] == "${datasource}"


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p.get("title")
    assert DASHBOARD["uid"] == "moetune" and DASHBOARD.get("id") is None
