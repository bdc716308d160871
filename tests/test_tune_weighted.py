"""`tune --objective weighted:SERVICE=METRIC:WEIGHT,...`: the spec's parser and its errors, the
figures read from raw layout samples, and the score relative to the baseline (pure; the search on
the testbed is in tests/test_tune_weighted_server.py)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from moetune.bench.analysis.serve import LOAD, SERVICE, SHARED
from moetune.errors import InputError
from moetune.tune import weighted as wt
from tests.bench.test_serve_metrics import sample

SPEC = "weighted:main=tg:1,worker0=goodput:0.5"
SLO = (("ttft_ms", 100.0),)


def test_the_spec_reads_terms_weights_and_aliases() -> None:
    w = wt.parse(SPEC)
    assert [(t.service, t.metric, t.weight) for t in w.terms] == [("main", "tg", 1.0), ("worker0", "goodput", 0.5)]
    w = wt.parse(" weighted: main=tg , main=pp:0.25, w=tok_s:2 ")
    assert [(t.name, t.weight) for t in w.terms] == [("main.tg", 1.0), ("main.pp", 0.25), ("w.throughput", 2.0)]
    assert w.services == ("main", "w")
    assert w.to_json()["relative_to"] == "baseline"


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("weighted:", "give the terms", "main=tg:1"),
        ("weighted:main", "'main' is not SERVICE=METRIC:WEIGHT", "e.g."),
        ("weighted:main=speed:1", "unknown metric 'speed'", "tg, pp, ttft, itl, tpot, goodput, throughput, tok_s"),
        ("weighted:main=tg:0", "the weight '0' is not a positive number", "W > 0"),
        ("weighted:main=tg:-1", "the weight '-1' is not a positive number", "drop a term"),
        ("weighted:main=tg:x", "the weight 'x' is not a positive number", "main=tg:W"),
        ("weighted:main=tg:inf", "not a positive number", "W > 0"),
        ("weighted:main=tg:1,main=tg:2", "main=tg is given twice", "once"),
        ("weighted:,,", "no terms given", "e.g."),
    ],
)
def test_a_bad_spec_names_the_problem_and_the_fix(text: str, message: str, hint: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        wt.parse(text)
    assert e.value.hint is not None and hint in e.value.hint


CHECK = {"tuned": "main", "loaded": ["worker0"], "services": ["main", "worker0", "worker1"]}


@pytest.mark.parametrize(
    ("text", "kw", "message", "hint"),
    [
        (SPEC, {"services": None}, "weighs services of a layout", "--layout FILE --service NAME"),
        ("weighted:main=tg:1,coder=ttft:1", {}, r"coder is no service of the layout \(services: main, worker0, worker1\)", "main=ttft:1"),
        ("weighted:main=tg:1,worker1=ttft:1", {}, "worker1 has no --with-load spec and is not the service tuned", "--with-load worker1=SPEC"),
        ("weighted:main=goodput:1", {}, "main is the service tuned", "main=tg:1"),
        ("weighted:main=tg,worker0=tg:1", {}, "tg is the tuned service's", "worker0's goodput, throughput"),
        (SPEC, {}, "worker0=goodput counts the requests that meet latency targets: give --slo", "--slo ttft_ms="),
    ],
)  # fmt: skip
def test_a_spec_that_does_not_suit_the_search_is_refused(
    text: str, kw: dict[str, Any], message: str, hint: str
) -> None:
    with pytest.raises(InputError, match=message) as e:
        wt.check(wt.parse(text), **{**CHECK, **kw})  # type: ignore[arg-type]
    assert e.value.hint is not None and hint in e.value.hint


def test_targets_without_a_goodput_term_are_refused() -> None:
    from dataclasses import replace

    with pytest.raises(InputError, match="--slo: only a goodput term") as e:
        wt.check(replace(wt.parse("weighted:main=tg:1,worker0=ttft:1"), slo=SLO), **CHECK)  # type: ignore[arg-type]
    assert e.value.hint is not None and "drop --slo" in e.value.hint


def test_a_spec_that_suits_the_search_passes() -> None:
    from dataclasses import replace

    wt.check(replace(wt.parse(SPEC), slo=SLO), **CHECK)  # type: ignore[arg-type]
    wt.check(wt.parse("weighted:main=tg:1,main=ttft:0.2,worker0=tpot:1,worker0=throughput:1"), **CHECK)  # type: ignore[arg-type]


def _req(
    service: str, t0: float, ttft: float, gaps: list[float], load: str = SHARED, prompt: int = 64
) -> dict[str, Any]:
    """A request to ``service`` sent at ``t0``: its first token ``ttft`` s later, then one token per gap."""
    t, chunks = t0 + ttft, [[t0 + ttft, 1, 1, 0]]
    for g in gaps:
        t += g
        chunks.append([t, 1, 1, 0])
    return {**sample(chunks, t_send=t0, prompt_tokens=prompt, count_source="timings"), SERVICE: service, LOAD: load}


def run_samples(main_tpot: float, worker_ttft: float) -> list[dict[str, Any]]:
    """main: three single-stream requests (TPOT ``main_tpot``); worker0: two rounds of two streams,
    each request's first token ``worker_ttft`` s after it was sent; an alone request of each that
    no figure reads."""
    out = [_req("main", 10.0 * k, 0.1 * (k + 1), [main_tpot * (1 + 0.1 * k)] * 4) for k in range(3)]
    for rnd in range(2):
        for _ in range(2):
            out.append({**_req("worker0", 1.0 * rnd, worker_ttft, [0.01] * 9), "concurrency": 2})
    out.append(_req("main", 50.0, 0.01, [0.001] * 4, load="alone"))
    out.append(_req("worker0", 60.0, 0.01, [0.001] * 9, load="alone"))
    return out


def test_the_figures_are_the_shared_levels() -> None:
    from dataclasses import replace

    w = replace(
        wt.parse("weighted:main=tg:1,main=pp:1,worker0=goodput:0.5,worker0=throughput:1,worker0=ttft:1"), slo=SLO
    )
    f = wt.figures(run_samples(0.05, 0.05), w, {"worker0": 2})
    by = {t.name: x for t, x in f.items()}
    assert by["main.tg"].value == pytest.approx(1 / 0.055)  # the median request's 1 / TPOT
    assert by["main.tg"].n == 3 and len(by["main.tg"].spread) == 3
    assert by["main.pp"].value == pytest.approx(64 / 0.2)  # the median prompt tokens / TTFT
    assert by["worker0.ttft"].value == pytest.approx(50.0)  # ms
    # goodput: every request met TTFT <= 100 ms: 4 over the level's span (first sent at 0, last ended near 1.14 s)
    span = 1.0 + 0.05 + 0.09 + 0.001
    assert by["worker0.goodput"].value == pytest.approx(4 / span, rel=1e-3)
    assert by["worker0.goodput"].floor == pytest.approx(0.5 / span, rel=1e-3)
    assert by["worker0.throughput"].value == pytest.approx(40 / span, rel=1e-3)  # 10 tokens a request
    assert len(by["worker0.goodput"].spread) == 2  # a completion window per round of the two streams
    late = wt.figures(run_samples(0.05, 0.5), w, {"worker0": 2})
    assert {t.name: x for t, x in late.items()}["worker0.goodput"].value == 0.0  # none met the target


def test_the_score_is_the_weighted_sum_relative_to_the_baseline() -> None:
    from dataclasses import replace

    w = replace(wt.parse("weighted:main=tg:1,worker0=goodput:0.5,worker0=ttft:2"), slo=(("ttft_ms", 300.0),))
    base = wt.figures(run_samples(0.05, 0.1), w, {"worker0": 2})
    other = wt.figures(run_samples(0.025, 0.2), w, {"worker0": 2})  # main twice as fast, worker0 slower
    scores = wt.scores(w, {0: base, 1: other})
    assert scores[0].total == pytest.approx(3.5) and scores[0].reference == 0  # the sum of the weights
    fb, fo = ({t.name: x.value for t, x in f.items()} for f in (base, other))
    expect = (
        1 * fo["main.tg"] / fb["main.tg"]
        + 0.5 * fo["worker0.goodput"] / fb["worker0.goodput"]
        + 2 * fb["worker0.ttft"] / fo["worker0.ttft"]  # a latency enters inverted
    )
    assert scores[1].total == pytest.approx(expect)
    assert fo["main.tg"] / fb["main.tg"] == pytest.approx(2.0)
    assert [p.contribution for p in scores[1].parts] == pytest.approx(
        [2.0, 0.5 * fo["worker0.goodput"] / fb["worker0.goodput"], 1.0]
    )
    for sc in scores.values():  # the samples the search ranks: an odd count, their median the score
        assert len(sc.samples) % 2 == 1 and statistics.median(sc.samples) == pytest.approx(sc.total)
        assert min(sc.samples) < sc.total < max(sc.samples)  # main's requests differ: a spread


def test_a_baseline_goodput_of_zero_counts_as_its_floor() -> None:
    from dataclasses import replace

    w = replace(wt.parse("weighted:worker0=goodput:1"), slo=SLO)
    none_met = wt.figures(run_samples(0.05, 0.5), w, {"worker0": 2})
    all_met = wt.figures(run_samples(0.05, 0.05), w, {"worker0": 2})
    scores = wt.scores(w, {0: none_met, 1: all_met})
    (p,) = scores[1].parts
    assert p.reference == pytest.approx(next(iter(none_met.values())).floor)
    span_none, span_all = 1.0 + 0.5 + 0.09 + 0.001, 1.0 + 0.05 + 0.09 + 0.001
    assert scores[1].total == pytest.approx((4 / span_all) / (0.5 / span_none), rel=1e-3)
    assert scores[0].total == 0.0


def test_without_a_measured_baseline_the_first_whole_candidate_is_the_reference() -> None:
    w = wt.parse("weighted:main=tg:1")
    f = wt.figures(run_samples(0.05, 0.05), w, {})
    empty = wt.figures([], w, {})
    scores = wt.scores(w, {0: empty, 2: f, 3: f})
    assert scores[2].reference == 2 and scores[3].total == pytest.approx(1.0)
    assert scores[0].total is None and "main's tg: no successful request" in (scores[0].problem or "")
    assert all(sc.total is None for sc in wt.scores(w, {0: empty}).values())


def test_the_prior_moves_only_the_tuned_services_terms() -> None:
    w = wt.parse("weighted:main=tg:1,main=ttft:1,worker0=goodput:0.5")
    base = wt.Predicted(tg=10.0, pp=100.0, ttft_s=1.0)
    assert wt.predicted(w, "main", base, base) == pytest.approx(2.5)
    faster = wt.Predicted(tg=20.0, pp=100.0, ttft_s=0.5)
    assert wt.predicted(w, "main", faster, base) == pytest.approx(2 + 2 + 0.5)


def test_the_terms_spreads_add_in_quadrature_around_the_score() -> None:
    w = wt.parse("weighted:a=tg:1,a=pp:1")
    tg, pp = w.terms
    figs = {tg: wt.Figure(value=2.0, spread=(1.0, 2.0, 3.0)), pp: wt.Figure(value=4.0, spread=(2.0, 4.0, 6.0))}
    sc = wt.score(w, figs, figs, 0)
    assert sc.total == pytest.approx(2.0)
    # each term's normalised values are 0.5, 1, 1.5; at the quantiles 1/6, 1/2, 5/6 each lies 1/3 from its median
    assert sc.samples == pytest.approx((2 - 2**0.5 / 3, 2.0, 2 + 2**0.5 / 3))
    one = wt.score(w, {tg: figs[tg], pp: wt.Figure(value=4.0, spread=(4.0,))}, figs, 0)
    assert one.samples == pytest.approx((2 - 1 / 3, 2.0, 2 + 1 / 3))  # a term of one value adds no spread
