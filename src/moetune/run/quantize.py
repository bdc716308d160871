"""Run llama-quantize: its output logged to a file beside the result, its per-tensor lines turned
into progress, and the written file checked against the prediction, tensor by tensor."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from moetune.engine.quantize import QuantPlan, progress_of
from moetune.errors import RuntimeFailure
from moetune.run.process import end

Progress = Callable[[int, int, str], None]  # (tensor number, count, name)


@dataclass(frozen=True, slots=True)
class Mismatch:
    name: str
    predicted: str  # "TYPE BYTES"
    written: str


def run_quantize(argv: Sequence[str], log: Path, progress: Progress | None = None) -> None:
    """Run the command; RuntimeFailure with the log's last lines when it fails."""
    tail: list[str] = []
    with log.open("w") as f:
        p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            assert p.stdout is not None
            for line in p.stdout:
                f.write(line)
                tail = [*tail[-19:], line.rstrip()]
                got = progress_of(line)
                if got is not None and progress is not None:
                    progress(*got)
            rc = p.wait()
        finally:
            end(p)
    if rc != 0:
        raise RuntimeFailure(f"llama-quantize failed (exit {rc}); its log: {log}", details=tuple(tail[-8:]))


def check_written(qp: QuantPlan, out: Path) -> list[Mismatch]:
    """Tensors whose type or bytes in the written file differ from the prediction (the bytes from
    the file's own layout: the gap to the next tensor's data, padding removed). Empty: exact."""
    from moetune.model.gguf_read import read_gguf

    f = read_gguf(out)
    order = sorted(f.tensors, key=lambda t: t.offset)
    ends = [t.offset for t in order[1:]] + [f.file_size]
    span = {t.name: e - t.offset for t, e in zip(order, ends, strict=True)}
    written = {t.name: t for t in f.tensors}
    bad = []
    for t in qp.tensors:
        w = written.get(t.name)
        if w is None:
            bad.append(Mismatch(t.name, f"{t.type} {t.nbytes}", "missing"))
            continue
        pad = -(-t.nbytes // f.alignment) * f.alignment
        if w.qtype.name != t.type or w.nbytes != t.nbytes or span[t.name] != pad:
            bad.append(Mismatch(t.name, f"{t.type} {t.nbytes}", f"{w.qtype.name} {w.nbytes} (span {span[t.name]})"))
    bad += [Mismatch(n, "absent", "written") for n in written.keys() - {t.name for t in qp.tensors}]
    return bad
