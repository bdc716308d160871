"""llama-perplexity's output, both eras, from real runs (llama.cpp build 11434) and the legacy
form ik_llama.cpp prints (examples/perplexity: no prefix, the longer final line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs.mainline import split_prefix
from moetune.kinds import LogEra
from moetune.quality import perplexity_output as po

FIX = Path(__file__).parent.parent / "fixtures" / "quality"


def test_kld_mainline_rows_and_summary() -> None:
    o = po.parse_kld((FIX / "kld-mainline.txt").read_text())
    assert o.era == LogEra.MAINLINE and (o.n_chunk, o.n_ctx) == (33, 256)
    assert (
        len(o.rows) == 33 and o.rows[0].kld == pytest.approx(0.00161) and o.rows[0].same_top == pytest.approx(0.40945)
    )
    s = o.summary
    assert s is not None and o.complete
    assert s.kld == pytest.approx(0.001419) and s.kld_percentiles["99.0"] == pytest.approx(0.001963)
    assert s.same_top == pytest.approx(0.76593) and s.ppl_base == pytest.approx(277.035088)


def test_kld_lost_tail_keeps_the_rows() -> None:
    o = po.parse_kld((FIX / "kld-mainline-lost-tail.txt").read_text())
    assert not o.complete and o.n_chunk == 12 and len(o.rows) == 11  # the logger lost row 12 and the summary


def test_ppl_mainline() -> None:
    o = po.parse_ppl((FIX / "ppl-mainline.txt").read_text())
    assert len(o.running) == 33 and o.running[0] == pytest.approx(294.2111)
    assert o.final == (pytest.approx(277.0351), pytest.approx(1.57009))


def test_legacy_era() -> None:
    text = "\n".join(split_prefix(x)[0] for x in (FIX / "ppl-mainline.txt").read_text().splitlines())
    text = text.replace("Final estimate: PPL = 277.0351", "Final estimate: PPL over 33 chunks for n_ctx=256 = 277.0351")
    text = "llm_load_tensors: CPU buffer size = 7.8 MiB\nllama_kv_cache_init: CPU KV buffer size\n" + text
    o = po.parse_ppl(text)
    assert o.era == LogEra.LEGACY and o.final == (pytest.approx(277.0351), pytest.approx(1.57009))
    kld = "\n".join(split_prefix(x)[0] for x in (FIX / "kld-mainline.txt").read_text().splitlines())
    ok = po.parse_kld("llm_load_tensors: x\nllama_kv_cache_init: y\n" + kld)
    assert ok.era == LogEra.LEGACY and len(ok.rows) == 33 and ok.complete


def test_too_short() -> None:
    t = po.too_short(
        "perplexity: you need at least 1024 tokens to evaluate perplexity with a context of 512\n"
        "perplexity: the data file you provided tokenizes to only 300 tokens"
    )
    assert t == po.TooShort(1024, 512, 300)


def test_ik_llama_cpp_real_output() -> None:
    # ik_llama.cpp 0.1.5 (vendored in the ik-llama-cpp-python sdist): -c 128 --chunks 6
    p = po.parse_ppl((FIX / "ppl-ik.txt").read_text())
    assert (
        p.era == LogEra.LEGACY and len(p.running) == 6 and p.final == (pytest.approx(265.8777), pytest.approx(4.43242))
    )
    assert (p.n_chunk, p.n_ctx) == (6, 128)
    k = po.parse_kld((FIX / "kld-ik.txt").read_text())
    assert k.era == LogEra.LEGACY and len(k.rows) == 6 and k.summary is not None
    assert k.summary.kld == pytest.approx(0.001778) and k.summary.kld_percentiles["99.0"] == pytest.approx(0.00235)
    assert k.summary.same_top == pytest.approx(0.9127)
