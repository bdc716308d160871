"""Summarize a gpu_measure.sh work folder (raw/ with one .cmd/.out/.err per case and cases.tsv)
into summary.json and summary.md. Standard library only.

    python3 summarize.py WORKDIR        # writes WORKDIR/summary.json and WORKDIR/summary.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_FITP = re.compile(r"^(\S+) (\d+) (\d+) (\d+)\s*$")


def _cell(text: str, width: int) -> str:
    """A Markdown table cell: cut to ``width`` characters, pipes escaped."""
    if len(text) > width:
        text = text[: width - 3] + "..."
    return text.replace("|", "\\|")


def cases(raw: Path) -> list[dict]:
    rows = []
    tsv = raw / "cases.tsv"
    if not tsv.exists():
        return rows
    for line in tsv.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        rows.append({"name": parts[0], "rc": parts[1], "secs": parts[2], "cmd": parts[3]})
    return rows


def fit_rows(raw: Path, cs: list[dict]) -> list[dict]:
    out = []
    for c in cs:
        m = re.match(r"fit_c(\d+)_ub(\d+)_(\w+?)_(cpumoe|ncmoe64|fitprint|fit)(_faoff)?$", c["name"])
        if not m:
            continue
        o = raw / f"{c['name']}.out"
        text = o.read_text(errors="replace") if o.exists() else ""
        row = {
            "case": c["name"],
            "ctx": int(m[1]),
            "ub": int(m[2]),
            "cache": m[3],
            "placement": m[4],
            "fa": "off" if m[5] else "auto",
            "rc": c["rc"],
            "secs": c["secs"],
            "cmd": c["cmd"],
            "devices": {},
        }
        for line in text.splitlines():
            mm = _FITP.match(line)
            if mm:
                row["devices"][mm[1]] = {
                    "model_mib": int(mm[2]),
                    "context_mib": int(mm[3]),
                    "compute_mib": int(mm[4]),
                }
            elif line.startswith("-c "):
                row["fit_flags"] = line.strip()
        out.append(row)
    return out


def bench_rows(raw: Path, cs: list[dict]) -> list[dict]:
    out = []
    for c in cs:
        if not c["name"].startswith("bench_"):
            continue
        o = raw / f"{c['name']}.out"
        if not o.exists():
            continue
        for line in o.read_text(errors="replace").splitlines():
            line = line.strip().rstrip(",")
            if not line.startswith("{"):
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append(
                {
                    "case": c["name"],
                    "model": Path(j.get("model_filename", "")).name,
                    "n_cpu_moe": j.get("n_cpu_moe"),
                    "ot": j.get("tensor_buft_overrides"),
                    "fit_target": j.get("fit_target"),
                    "load_mode": j.get("load_mode"),
                    "n_prompt": j.get("n_prompt"),
                    "n_gen": j.get("n_gen"),
                    "n_depth": j.get("n_depth"),
                    "n_batch": j.get("n_batch"),
                    "n_ubatch": j.get("n_ubatch"),
                    "n_threads": j.get("n_threads"),
                    "flash_attn": j.get("flash_attn"),
                    "type_k": j.get("type_k"),
                    "avg_ts": j.get("avg_ts"),
                    "stddev_ts": j.get("stddev_ts"),
                    "samples_ts": j.get("samples_ts"),
                    "model_size": j.get("model_size"),
                    "gpu_info": j.get("gpu_info"),
                    "backends": j.get("backends"),
                }
            )
    return out


def _f(x: object, nd: int = 1) -> str:
    return "" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def markdown(doc: dict) -> str:
    lines = ["# moetune GPU measurements", ""]
    info = doc.get("info", {})
    if info:
        lines += ["## Machine", "", "```", *[f"{k}: {v}" for k, v in info.items()], "```", ""]
    if doc.get("bench"):
        lines += [
            "## Speed (llama-bench, t/s, mean ± sd over repeats)",
            "",
            "| case | n-cpu-moe | -ot | fitt | load | ub | test | t/s | sd |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in doc["bench"]:
            test = (f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}") + (
                f"@d{r['n_depth']}" if r["n_depth"] else ""
            )
            ot = _cell(r["ot"] if r["ot"] and r["ot"] != "none" else "", 40)
            lines.append(
                f"| {r['case']} | {r['n_cpu_moe']} | {ot} | {r['fit_target'] or ''} | {r['load_mode']} | "
                f"{r['n_ubatch']} | {test} | {_f(r['avg_ts'], 2)} | {_f(r['stddev_ts'], 2)} |"
            )
        lines.append("")
    if doc.get("fit"):
        lines += [
            "## llama-fit-params (MiB: model / context / compute per device)",
            "",
            "| ctx | ub | cache | fa | placement | rc | CUDA0 model | CUDA0 ctx | CUDA0 compute | Host model | Host ctx | Host compute | fit flags |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in doc["fit"]:
            g = r["devices"].get("CUDA0", {})
            h = r["devices"].get("Host", {})
            flags = _cell(r.get("fit_flags", ""), 60)
            lines.append(
                f"| {r['ctx']} | {r['ub']} | {r['cache']} | {r['fa']} | {r['placement']} | {r['rc']} | "
                f"{g.get('model_mib', '')} | {g.get('context_mib', '')} | {g.get('compute_mib', '')} | "
                f"{h.get('model_mib', '')} | {h.get('context_mib', '')} | {h.get('compute_mib', '')} | {flags} |"
            )
        lines.append("")
    failed = [c for c in doc.get("cases", []) if c["rc"] not in ("0",)]
    if failed:
        lines += ["## Cases that did not succeed", "", "| case | rc | secs |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['rc']} | {c['secs']} |" for c in failed]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    w = Path(sys.argv[1])
    raw = w / "raw"
    cs = cases(raw)
    info: dict[str, object] = {}
    for name in ("phase_times", "hostbw", "build"):
        p = raw / f"{name}.json"
        if p.exists():
            try:
                info[name] = json.loads(p.read_text())
            except json.JSONDecodeError:
                info[name] = p.read_text()[:500]
    for name in ("nvidia_smi", "nproc", "mem"):
        p = raw / f"{name}.txt"
        if p.exists():
            info[name] = " ".join(p.read_text().split())[:400]
    doc = {"info": info, "cases": cs, "fit": fit_rows(raw, cs), "bench": bench_rows(raw, cs)}
    (w / "summary.json").write_text(json.dumps(doc, indent=1))
    md = markdown(doc)
    (w / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
