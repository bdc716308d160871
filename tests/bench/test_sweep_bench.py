"""llama-sweep-bench as a backend: its rows (JSON lines or the markdown table) become depth samples
that every analysis reads as it reads `bench --depth`; its argv is the server's, minus serving."""

from __future__ import annotations

import pytest

from moetune.bench.analysis.summary import run_summary
from moetune.bench.single.sweep_bench import SweepRow, parse_row, parse_rows, row_sample, sweep_argv

# from ik_llama.cpp's examples/sweep-bench/README.md and its JSONL format string
MARKDOWN = """
main: n_kv_max = 8704, n_batch = 2048, n_ubatch = 512, flash_attn = 0, n_gpu_layers = -1, n_threads = 32

|    PP |     TG |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |
|-------|--------|--------|----------|----------|----------|----------|
|   512 |    128 |      0 |    1.100 |   465.51 |    2.311 |    55.38 |
|   512 |    128 |    512 |    1.183 |   432.97 |    1.895 |    67.55 |
"""
JSONL = (
    '{"n_kv_max": 8704, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 0, "n_gpu_layers": -1, "n_threads": 32, '
    '"n_threads_batch": 32, "pp": 512, "tg": 128, "n_kv": 0, "t_pp": 1.093814, "speed_pp": 468.086884, '
    '"t_tg": 1.780312, "speed_tg": 71.897514 }'
)


def test_rows_from_either_output_format() -> None:
    md = parse_rows(MARKDOWN)
    assert md == [
        SweepRow(pp=512, tg=128, n_kv=0, t_pp_s=1.1, t_tg_s=2.311),
        SweepRow(pp=512, tg=128, n_kv=512, t_pp_s=1.183, t_tg_s=1.895),
    ]
    assert md[0].pp_tok_s == pytest.approx(465.45, abs=0.1) and md[0].tg_tok_s == pytest.approx(55.39, abs=0.01)
    j = parse_row(JSONL)
    assert j is not None and (j.n_kv, j.pp, j.tg) == (0, 512, 128)
    assert j.tg_tok_s == pytest.approx(71.8975, rel=1e-4)
    assert parse_row("|    PP |     TG |   N_KV |") is None and parse_row("{not json") is None


def test_rows_are_depth_samples_the_summary_reads() -> None:
    rows = parse_rows(MARKDOWN)
    samples = [row_sample(r, rep) for rep in range(3) for r in rows]
    s = run_summary(samples)
    assert list(s["workloads"]) == ["d0", "d512"]  # the names `bench --depth 0,512` gives its workloads
    d512 = s["workloads"]["d512"]
    assert d512["depth"] == 512 and d512["n"] == 3
    assert d512["tg"]["median"] == pytest.approx(128 / 1.895, rel=1e-6)
    assert d512["pp"]["median"] == pytest.approx(512 / 1.183, rel=1e-6)


def test_the_argv_is_the_servers_without_serving() -> None:
    server = [
        "-m",
        "/m/x.gguf",
        "-c",
        "32768",
        "--parallel",
        "1",
        "-b",
        "2048",
        "-ub",
        "512",
        "-fa",
        "on",
        "-ngl",
        "999",
        "-ot",
        r"\.ffn_(up|down|gate)_exps=CPU",
        "--jinja",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
    ]
    assert sweep_argv(server, 4096, 32) == [
        "-m",
        "/m/x.gguf",
        "-b",
        "2048",
        "-ub",
        "512",
        "-fa",
        "on",
        "-ngl",
        "999",
        "-ot",
        r"\.ffn_(up|down|gate)_exps=CPU",
        "-c",
        "4096",
        "--output-format",
        "jsonl",
        "-n",
        "32",
    ]
