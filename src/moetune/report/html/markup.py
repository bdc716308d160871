"""HTML building blocks shared by the report's sections: escaping, tables, notes, numbers.

Every text that comes from data goes through :func:`esc`; helpers that take ``Cell`` values escape
plain strings and pass :class:`Raw` markup (made here or by the SVG helpers) through as it is.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Raw:
    """Markup made by the report itself, inserted without escaping."""

    html: str


Cell = str | Raw | int | float | None


def esc(x: object) -> str:
    """Text (or an attribute value) from the data, safe anywhere in HTML and SVG."""
    return html.escape(str(x), quote=True)


def cell(x: Cell) -> str:
    if isinstance(x, Raw):
        return x.html
    if x is None:
        return "–"
    if isinstance(x, float):
        return esc(fmt(x))
    return esc(x)


def fmt(x: float | None) -> str:
    """A figure with as many digits as it deserves (the tables' and ``compare``'s format)."""
    if x is None:
        return "–"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def fmt_mib(mib: float) -> str:
    """MiB as a person reads them: ``92.3 GiB``, ``512 MiB``, ``1.4 TiB``."""
    if abs(mib) >= 1024 * 1024:
        return f"{mib / 1024 / 1024:.2f} TiB"
    if abs(mib) >= 1024:
        return f"{mib / 1024:,.1f} GiB"
    return f"{mib:,.1f} MiB" if abs(mib) < 10 else f"{mib:,.0f} MiB"


def fmt_bytes(n: float) -> str:
    return fmt_mib(n / MIB)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    cls: str = "",
    numeric_from: int = 1,
    caption: str | None = None,
) -> str:
    """A table; columns from ``numeric_from`` on are right-aligned (figures)."""
    head = "".join(f"<th{' class=num' if i >= numeric_from else ''}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i >= numeric_from else ''}>{cell(c)}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table class="{esc(cls)}">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def facts(rows: Iterable[tuple[str, Cell]], *, cls: str = "facts") -> str:
    """A definition list of (name, value) pairs; empty values are left out."""
    items = "".join(f"<dt>{esc(k)}</dt><dd>{cell(v)}</dd>" for k, v in rows if v not in (None, ""))
    return f'<dl class="{esc(cls)}">{items}</dl>'


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{esc(cls)}">{esc(text)}</p>'


def badge(text: str, tone: str = "") -> str:
    return f'<span class="badge {esc(tone)}">{esc(text)}</span>'


def code_block(text: str) -> str:
    return f"<pre><code>{esc(text)}</code></pre>"


def section(sid: str, title: str, body: str) -> str:
    """A top-level section with a stable id (``plan``, ``runs``, …) that links and tests find."""
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{body}</section>'
