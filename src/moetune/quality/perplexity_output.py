"""llama-perplexity's output, parsed. Pure.

Two log eras print it (``moetune.kinds.LogEra``):

- mainline llama.cpp (build 11434, ``tools/perplexity/perplexity.cpp``): informational lines carry
  the ``0.00.034.203 I`` prefix; the final PPL is ``Final estimate: PPL = 277.0351 +/- 1.57009``;
- legacy (ik_llama.cpp ``examples/perplexity``, older llama.cpp): no prefix; ``Final estimate:
  PPL over 33 chunks for n_ctx=256 = 277.0351 +/- 1.57009``.

Both print the same running values: ``[k]PPL,`` after each chunk in perplexity mode, and one table
row per chunk with ``--kl-divergence`` (PPL, ln(PPL(Q)/PPL(base)), KL divergence, RMS Δp, Same top
p, each the mean over the chunks so far, ``± uncertainty``), then a summary (``Mean KLD``, its
percentiles, ``Same top p``) once at least 100 tokens were scored.

Mainline writes its output through an asynchronous logger that can lose its last lines when the
process exits (llama.cpp #22142): a parse may lack the summary or the last rows. What is there is
kept; :attr:`KldOutput.complete` says whether the summary came.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moetune.engine.logs import detect_era, split_lines
from moetune.engine.logs.mainline import split_prefix
from moetune.kinds import LogEra

_NUM = r"(-?(?:\d+\.?\d*|nan|inf))"
_PM = rf"\s*{_NUM}\s*±\s*{_NUM}"
_ROW = re.compile(rf"^\s*(\d+){_PM}{_PM}{_PM}{_PM}\s*%{_PM}\s*%\s*$")
_RUNNING_PPL = re.compile(r"\[(\d+)\](\d+\.\d+),")
_FINAL = {
    LogEra.MAINLINE: re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)"),
    LogEra.LEGACY: re.compile(r"Final estimate: PPL over (\d+) chunks for n_ctx=(\d+) = ([\d.]+) \+/- ([\d.]+)"),
}
_CHUNKS = re.compile(r"(?:computing|calculating perplexity) over (\d+) chunks(?:, n_ctx=(\d+))?")
_TOO_SHORT = re.compile(r"you need at least (\d+) tokens to evaluate perplexity with a context of (\d+)")
_TOKENS_ONLY = re.compile(r"tokenizes to only (\d+) tokens")
_SUMMARY = {
    "ppl_q": re.compile(rf"^Mean PPL\(Q\)\s*:{_PM}"),
    "ppl_base": re.compile(rf"^Mean PPL\(base\)\s*:{_PM}"),
    "kld": re.compile(rf"^Mean\s+KLD:{_PM}"),
    "same_top": re.compile(rf"^Same top p:{_PM}\s*%"),
}
_PERCENTILE = re.compile(rf"^(Maximum|Median|Minimum|\s*[\d.]+%)\s+KLD:\s*{_NUM}")


def _f(s: str) -> float:
    return float(s)


@dataclass(frozen=True, slots=True, kw_only=True)
class KldRow:
    """One chunk's row: each value the mean over chunks 1..``chunk`` (fractions, not percent)."""

    chunk: int
    ppl: float
    ppl_unc: float
    ln_ppl_ratio: float
    kld: float
    kld_unc: float
    same_top: float  # fraction of tokens whose most likely token is the reference's
    same_top_unc: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KldSummary:
    """The summary after the last chunk (fractions, not percent)."""

    ppl_q: float
    ppl_q_unc: float
    ppl_base: float
    ppl_base_unc: float
    kld: float
    kld_unc: float
    kld_percentiles: dict[str, float]  # "max", "99.9", "99.0", ..., "median", "min"
    same_top: float
    same_top_unc: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KldOutput:
    era: LogEra
    n_ctx: int | None
    n_chunk: int | None  # chunks announced
    rows: tuple[KldRow, ...]
    summary: KldSummary | None

    @property
    def complete(self) -> bool:
        return self.summary is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class PplOutput:
    era: LogEra
    n_ctx: int | None
    n_chunk: int | None
    running: tuple[float, ...]  # PPL over chunks 1..k, for k = 1, 2, ...
    final: tuple[float, float] | None  # (PPL, ±) of the final estimate


@dataclass(frozen=True, slots=True)
class TooShort:
    """The text holds fewer tokens than two chunks need."""

    need: int
    ctx: int
    have: int | None


def _lines(text: str) -> tuple[LogEra, list[str]]:
    lines = split_lines(text)
    era = detect_era(lines)
    if era == LogEra.MAINLINE:
        lines = [split_prefix(x)[0] for x in lines]
    return era, lines


def _chunks(lines: list[str]) -> tuple[int | None, int | None]:
    for x in lines:
        m = _CHUNKS.search(x)
        if m:
            return int(m[1]), int(m[2]) if m[2] else None
    return None, None


def announced_chunks(line: str) -> int | None:
    """The chunks a line announces llama-perplexity will compute (its ``over N chunks`` line)."""
    m = _CHUNKS.search(line)
    return int(m[1]) if m else None


def running_ppl_chunks(line: str) -> list[int]:
    """The chunks whose running PPL (``[k]PPL,``) a line of perplexity mode carries."""
    return [int(m[1]) for m in _RUNNING_PPL.finditer(line)]


def too_short(text: str) -> TooShort | None:
    m = _TOO_SHORT.search(text)
    if not m:
        return None
    h = _TOKENS_ONLY.search(text)
    return TooShort(int(m[1]), int(m[2]), int(h[1]) if h else None)


def parse_ppl(text: str) -> PplOutput:
    """Perplexity mode (the reference's run, which saves its logits)."""
    era, lines = _lines(text)
    n_chunk, n_ctx = _chunks(lines)
    running: dict[int, float] = {}
    for x in lines:
        for m in _RUNNING_PPL.finditer(x):
            running.setdefault(int(m[1]), float(m[2]))
    final = None
    for x in lines:
        fm = _FINAL[era].search(x) or _FINAL[LogEra.LEGACY if era == LogEra.MAINLINE else LogEra.MAINLINE].search(x)
        if fm:
            g = fm.groups()
            final = (float(g[-2]), float(g[-1]))
            if len(g) == 4:
                n_chunk, n_ctx = n_chunk or int(g[0]), n_ctx or int(g[1])
    ordered = []
    for k in range(1, len(running) + 1):  # a gap (a lost line) ends the series
        if k not in running:
            break
        ordered.append(running[k])
    return PplOutput(era=era, n_ctx=n_ctx, n_chunk=n_chunk, running=tuple(ordered), final=final)


def parse_row(line: str) -> KldRow | None:
    m = _ROW.match(line)
    if not m:
        return None
    g = m.groups()
    return KldRow(
        chunk=int(g[0]),
        ppl=_f(g[1]),
        ppl_unc=_f(g[2]),
        ln_ppl_ratio=_f(g[3]),
        kld=_f(g[5]),
        kld_unc=_f(g[6]),
        same_top=_f(g[9]) / 100.0,
        same_top_unc=_f(g[10]) / 100.0,
    )


def parse_kld(text: str) -> KldOutput:
    """``--kl-divergence`` mode (a candidate against the reference's saved logits)."""
    era, lines = _lines(text)
    n_chunk, n_ctx = _chunks(lines)
    rows: list[KldRow] = []
    found: dict[str, tuple[float, float]] = {}
    pct: dict[str, float] = {}
    for x in lines:
        r = parse_row(x)
        if r is not None:
            if r.chunk == len(rows) + 1:  # in order; a gap (a lost line) ends the table
                rows.append(r)
            continue
        s = x.strip()
        for key, rx in _SUMMARY.items():
            m = rx.match(s)
            if m:
                found[key] = (_f(m[1]), _f(m[2]))
        pm = _PERCENTILE.match(s)
        if pm:
            name = pm[1].strip().rstrip("%")
            pct[{"Maximum": "max", "Median": "median", "Minimum": "min"}.get(name, name)] = _f(pm[2])
    summary = None
    if all(k in found for k in _SUMMARY):
        summary = KldSummary(
            ppl_q=found["ppl_q"][0],
            ppl_q_unc=found["ppl_q"][1],
            ppl_base=found["ppl_base"][0],
            ppl_base_unc=found["ppl_base"][1],
            kld=found["kld"][0],
            kld_unc=found["kld"][1],
            kld_percentiles=pct,
            same_top=found["same_top"][0] / 100.0,
            same_top_unc=found["same_top"][1] / 100.0,
        )
    return KldOutput(era=era, n_ctx=n_ctx, n_chunk=n_chunk, rows=tuple(rows), summary=summary)
