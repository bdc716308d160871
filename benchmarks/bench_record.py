"""What `moetune record` adds: the same streamed request sent to a real llama-server directly and
through the proxy, interleaved (ABBA), the differences paired by round.

The server runs a generated MoE model (tokens about a millisecond apart, so the proxy relays a
thousand events a second) with one slot and one thread; the proxy is the real command in its own
process (`python -m moetune record`), the client is serve-bench's own (kernel receive timestamps).
Each request is identical (sampled with a fixed seed, ignore_eos, no prompt cache,
``timings_per_token``), so each event of the two answers is the same event. (Greedy decoding of
the random model picks bytes that are not UTF-8, which llama-server holds back and sends in a
few large events; sampled ones give an event for nearly every token.) Per round, proxied minus direct:

- TTFT: the first token's arrival after the request was sent;
- per chunk: each event's arrival after the request was sent (what a user waits for each one);
- per chunk after the first: each later event's arrival after the first one's, less the server's
  own time between them (``timings.predicted_ms``, so the server's variation from one answer to
  the next drops out): what the proxy adds to a chunk beyond what it added to the first, i.e.
  whether it holds chunks back.

Besides, the proxy's own figures from the session it wrote: forwarding a request, and the time
from a piece of the answer reaching the machine (kernel time) to its being written to the client.

Writes results/record.json and results/record.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.helpers import engine_bin_dir, llama_server  # noqa: E402

from moetune.bench.http.client import connect  # noqa: E402
from moetune.bench.http.clock import run as run_loop  # noqa: E402
from moetune.bench.record.session import percentiles  # noqa: E402
from moetune.bench.serve.request import RequestRecord, stream_chat  # noqa: E402
from moetune.model.archs import Dims  # noqa: E402
from moetune.model.testmodel import generate  # noqa: E402
from moetune.run.process import end  # noqa: E402

ROUNDS = 200  # each a direct and a proxied request, in ABBA order
TOKENS = 64
BODY = json.dumps(
    {
        "messages": [{"role": "user", "content": "Tell me a story about a proxy."}],
        "stream": True,
        "max_tokens": TOKENS,
        "temperature": 1.0,
        "seed": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "timings_per_token": True,
    }
).encode()


def _events(rec: RequestRecord) -> list[tuple[float, float | None]]:
    """Each token event: (arrival after send in ms, the server's own time of it in ms)."""
    prompt_ms = float((rec.timings or {}).get("prompt_ms") or 0.0)
    out = []
    for c in rec.chunks:
        if c[1]:
            server = None if c[4] is None else prompt_ms + float(c[4])
            out.append(((float(c[0]) - rec.t_send) * 1000, server))  # type: ignore[arg-type]
    return out


async def _rounds(direct_url: str, proxy_url: str) -> list[dict[str, Any]]:
    direct, proxied = connect(direct_url, timeout_s=60), connect(proxy_url, timeout_s=60)
    out = []
    try:
        for r in range(-2, ROUNDS):  # two rounds of warm-up
            pair: dict[str, list[tuple[float, float | None]]] = {}
            order = ("direct", "proxy") if r % 4 in (0, 3) else ("proxy", "direct")
            for which in order:
                rec = RequestRecord(
                    index=r, concurrency=1, rate=None, prompt_tokens=None, max_tokens=TOKENS, t_sched=time.monotonic()
                )
                await stream_chat(direct if which == "direct" else proxied, BODY, rec)
                assert rec.error is None, (which, rec.error, rec.detail)
                pair[which] = _events(rec)
            if r >= 0:
                out.append(pair)
    finally:
        await direct.aclose()
        await proxied.aclose()
    return out


def _differences(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ttft, chunk, later = [], [], []
    for p in rounds:
        d, x = p["direct"], p["proxy"]
        assert len(d) == len(x), "the two answers differ: the seeded sampling was not repeated"
        ttft.append(x[0][0] - d[0][0])
        (ta0, sa0), (tb0, sb0) = d[0], x[0]
        for i, ((ta, sa), (tb, sb)) in enumerate(zip(d, x, strict=True)):
            chunk.append(tb - ta)
            if i and None not in (sa, sb, sa0, sb0):
                later.append(((tb - tb0) - (sb - sb0)) - ((ta - ta0) - (sa - sa0)))  # type: ignore[operator]
    return {
        "ttft_ms": percentiles(ttft),
        "chunk_ms": percentiles(chunk),
        "later_chunk_ms": percentiles(later),
        "direct_ttft_ms": percentiles([p["direct"][0][0] for p in rounds]),
        "proxy_ttft_ms": percentiles([p["proxy"][0][0] for p in rounds]),
        "events_per_answer": percentiles([float(len(p["direct"])) for p in rounds]),
    }


def main(results: Path) -> None:
    bin_dir = engine_bin_dir()
    assert bin_dir is not None, "llama.cpp is not built: make engine"
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model = d / "m.gguf"
        generate(model, "qwen3moe", Dims(n_layer=4), "f16")
        session = d / "session.jsonl"
        with llama_server(bin_dir, model, d / "s.log", "-nr", "-c", "2048", "--parallel", "1", "-t", "1") as srv:
            err = d / "record.err"
            with open(err, "wb") as f:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "moetune",
                        "record",
                        "--listen",
                        "127.0.0.1:0",
                        "--upstream",
                        srv.url,
                        "-o",
                        str(session),
                        "--json",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=f,
                )
            try:
                deadline = time.monotonic() + 30
                while not (m := re.search(r"recording (http://\S+) ->", err.read_text())):
                    assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
                    time.sleep(0.05)
                rounds = run_loop(_rounds(srv.url, m[1]))
                proc.terminate()
                out, _ = proc.communicate(timeout=30)
                own = json.loads(out)
                lines = [json.loads(x) for x in session.read_text().splitlines()]
            finally:
                end(proc)
    diff = _differences(rounds)
    connect = percentiles([c for x in lines if (c := x["proxy"]["connect_ms"]) is not None])
    rest = percentiles([x["proxy"]["forward_ms"] - (x["proxy"]["connect_ms"] or 0) for x in lines])
    doc = {
        "rounds": ROUNDS,
        "tokens": TOKENS,
        "load_before": load0,
        "load_after": os.getloadavg(),
        "difference_proxy_minus_direct": diff,
        "proxy_own_ms": {**own["proxy_ms"], "connect": connect, "forward_not_connecting": rest},
        "session": {k: own[k] for k in ("requests", "completion_tokens", "errors")},
    }
    (results / "record.json").write_text(json.dumps(doc, indent=2))

    def row(name: str, p: dict[str, Any]) -> str:
        return f"| {name} | {p['p50']:.3f} | {p['p99']:.3f} | {p['n']} |"

    px = own["proxy_ms"]
    (results / "record.md").write_text(
        "\n".join(
            [
                "# What the recording proxy adds (`make bench`, benchmarks/bench_record.py)",
                "",
                f"A llama-server (generated qwen3moe, 4 layers, `-nr --parallel 1 -t 1`) answered {ROUNDS} rounds of the same "
                f"streamed chat request ({TOKENS} tokens, seeded sampling, ignore_eos, no prompt cache), each round once directly and "
                "once through `moetune record` (its own process), in ABBA order, timed by serve-bench's client (kernel "
                f"receive stamps); {diff['events_per_answer']['p50']:.0f} events per answer. 2 shared CPUs, load average "
                f"{load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after.",
                "",
                "## Through the proxy minus direct, paired by round (ms)",
                "",
                "| | p50 | p99 | n |",
                "|---|---:|---:|---:|",
                row("TTFT", diff["ttft_ms"]),
                row("each chunk's arrival after sending", diff["chunk_ms"]),
                row(
                    "each chunk after the first, beyond what the first got (net of the server's time)",
                    diff["later_chunk_ms"],
                ),
                "",
                f"TTFT direct p50 {diff['direct_ttft_ms']['p50']:.3f} ms, through the proxy {diff['proxy_ttft_ms']['p50']:.3f} ms.",
                "",
                "## The proxy's own figures, from its session file (ms)",
                "",
                "| | p50 | p99 | n |",
                "|---|---:|---:|---:|",
                row("forwarding a request (connecting to the upstream included)", px["forward"]),
                row(
                    "of which connecting to the upstream (llama-server closes a connection after each stream)", connect
                ),
                row("forwarding a request, connecting not counted (per request)", rest),
                row("first byte of an answer: in (kernel time) to written", px["first_byte"]),
                row("each relayed piece: in (kernel time) to written", px["piece"]),
                "",
            ]
        )
    )
    print(json.dumps(doc, indent=2))
