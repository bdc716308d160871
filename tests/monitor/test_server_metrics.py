"""llama-server's own /metrics (started with --metrics) read by :func:`parse_text`, and re-exported
as moetune_server_* series that the dashboard's queries find."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.monitor.exposition import BY_NAME, LabelledSnapshot, parse_text, render
from moetune.monitor.snapshot import Snapshot
from tests.helpers import llama_server

pytestmark = pytest.mark.server

# what the dashboard and the README rely on; a newer engine may add more
USED = (
    "prompt_tokens_total",
    "tokens_predicted_total",
    "prompt_seconds_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "requests_processing",
    "requests_deferred",
)


def test_a_real_llama_servers_metrics_parse_and_re_export(bin_dir: Path, tmp_path: Path) -> None:
    g = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=2))
    # -nr: CPU weight repacking crashes on this machine's CPU (DESIGN.md section 5)
    with llama_server(
        bin_dir, g.files[0], tmp_path / "server.log", "-nr", "-c", "512", "--parallel", "1", "-t", "1", "--metrics"
    ) as srv:
        before = parse_text(httpx.get(srv.url + "/metrics", timeout=10).text)
        r = httpx.post(
            srv.url + "/completion",
            json={"prompt": "hello there", "n_predict": 4, "ignore_eos": True, "cache_prompt": False},
            timeout=60,
        )
        r.raise_for_status()
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    after = parse_text(text)
    for name in USED:
        assert f"llamacpp:{name}" in before and f"llamacpp:{name}" in after, name
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 4
    assert after["llamacpp:prompt_tokens_total"] > before["llamacpp:prompt_tokens_total"]
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"]
    # every series prometheus_client reads from the server, parse_text has (the finite ones; it
    # names a counter without _total, llama.cpp's n_tokens_max, with one added)
    theirs = {
        s.name.removesuffix("_total"): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if not s.labels and math.isfinite(s.value)
    }
    assert theirs == {k.removesuffix("_total"): v for k, v in after.items() if "{" not in k}

    # this engine's own series all have a name in moetune's table (a newer engine's new ones go in the table)
    assert not [k for k in after if "{" not in k and f"moetune_server_{k.split(':')[-1]}" not in BY_NAME]

    fams = {
        f.name: f
        for f in text_string_to_metric_families(
            render(
                [
                    LabelledSnapshot(
                        snapshot=Snapshot(t=1.0, servers={"main": after}), run=1, kind="serve-bench", label="x"
                    )
                ]
            )
        )
    }
    for name in USED:
        ours = f"moetune_server_{name}"
        assert ours in BY_NAME, ours
        fam = fams[ours.removesuffix("_total")]
        assert fam.type == BY_NAME[ours].type
        (sample,) = fam.samples
        assert sample.labels == {"run": "1", "service": "main"}
        assert sample.value == after[f"llamacpp:{name}"]
