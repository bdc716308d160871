"""Talking to a llama-server (or ik_llama.cpp server): its properties, and one streamed request
recorded as a raw sample.

A raw sample keeps what was observed and nothing computed: the server's ``timings`` and
``usage`` verbatim, the client's clock at send, at the response headers, at every streamed chunk
and at the end (seconds from send, ``time.perf_counter``), and counts of what came back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from moetune.errors import RuntimeFailure


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    build_info: str | None
    model_path: str | None
    model_alias: str | None
    n_ctx: int | None  # per slot
    total_slots: int | None
    props: dict[str, Any]  # /props, without the chat template and sampling defaults

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "build_info": self.build_info, "model_path": self.model_path,
                "model_alias": self.model_alias, "n_ctx": self.n_ctx, "total_slots": self.total_slots,
                "props": self.props}


def _fail(url: str, what: str, e: Exception | str) -> RuntimeFailure:
    return RuntimeFailure(f"{url}: {what}: {e}",
                          hint="is llama-server running there? check its log, or `curl URL/health`")


def probe(client: httpx.Client, url: str) -> ServerInfo:
    """Check /health and read /props (absent on some builds: then the fields are None)."""
    try:
        h = client.get(url + "/health", timeout=10)
    except httpx.HTTPError as e:
        raise _fail(url, "cannot reach the server", e) from None
    if h.status_code == 503:
        raise RuntimeFailure(f"{url}: the server is still loading the model (/health answers 503)",
                             hint="wait until /health answers 200, then run again")
    if h.status_code != 200:
        raise _fail(url, "/health", f"HTTP {h.status_code}")
    props: dict[str, Any] = {}
    try:
        r = client.get(url + "/props", timeout=10)
        if r.status_code == 200:
            props = r.json()
    except (httpx.HTTPError, json.JSONDecodeError):
        props = {}
    gen = props.get("default_generation_settings") or {}
    small = {k: v for k, v in props.items() if k not in ("chat_template", "default_generation_settings")}
    n_ctx = gen.get("n_ctx", props.get("n_ctx"))
    return ServerInfo(url, props.get("build_info"), props.get("model_path"), props.get("model_alias"),
                      int(n_ctx) if n_ctx is not None else None,
                      int(props["total_slots"]) if "total_slots" in props else None, small)


def tokenize(client: httpx.Client, url: str, text: str) -> list[int]:
    try:
        r = client.post(url + "/tokenize", json={"content": text, "add_special": False}, timeout=30)
        r.raise_for_status()
        return [int(t) for t in r.json()["tokens"]]
    except (httpx.HTTPError, KeyError, ValueError) as e:
        raise _fail(url, "/tokenize failed (depth workloads need it)", e) from None


def stream(client: httpx.Client, url: str, path: str, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """POST a streaming request; return the raw observations (see the module docstring).

    A server may close an idle keep-alive connection just as the client reuses it; the request
    then fails before any answer, and is sent once more on a new connection (``retried``)."""
    try:
        return _stream(client, url, path, body, timeout_s=timeout_s)
    except _Stale:
        raw = _stream(client, url, path, body, timeout_s=timeout_s, retry=False)
        raw["retried"] = True
        return raw


def sse_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of an event stream, split at LF only. (httpx's ``iter_lines`` also splits at U+2028,
    U+0085 and the like, which JSON leaves unescaped inside strings: a model's text can hold them.)"""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            yield raw.rstrip(b"\r").decode("utf-8", errors="replace")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", errors="replace")


class _Stale(Exception):
    """The connection failed before the server sent anything back."""


def _stream(client: httpx.Client, url: str, path: str, body: dict[str, Any], *, timeout_s: float,
            retry: bool = True) -> dict[str, Any]:
    content_s: list[float] = []
    reasoning_s: list[float] = []
    content_chars = reasoning_chars = 0
    final: dict[str, Any] = {}
    finish_reason: str | None = None
    t_unix = time.time()
    t0 = time.perf_counter()
    headers_s: float | None = None
    try:
        with client.stream("POST", url + path, json=body,
                           timeout=httpx.Timeout(timeout_s, connect=10.0)) as r:
            headers_s = time.perf_counter() - t0
            if r.status_code != 200:
                text = r.read().decode(errors="replace")[:500]
                raise RuntimeFailure(f"{url}{path}: HTTP {r.status_code}: {text}",
                                     hint="the server refused the request; its message says why")
            for line in sse_lines(r.iter_bytes()):
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                t = time.perf_counter() - t0
                ev = json.loads(payload)
                if "error" in ev:
                    raise RuntimeFailure(f"{url}{path}: the server reported an error: {ev['error']}")
                for ch in ev.get("choices") or []:  # OpenAI chat chunks
                    delta = ch.get("delta") or {}
                    if delta.get("reasoning_content"):
                        reasoning_s.append(t)
                        reasoning_chars += len(delta["reasoning_content"])
                    if delta.get("content"):
                        content_s.append(t)
                        content_chars += len(delta["content"])
                    finish_reason = ch.get("finish_reason") or finish_reason
                if "choices" not in ev and ev.get("content"):  # /completion chunks
                    content_s.append(t)
                    content_chars += len(ev["content"])
                if "timings" in ev or "usage" in ev or ev.get("stop"):
                    final.update(ev)
    except httpx.TimeoutException as e:
        raise RuntimeFailure(f"{url}{path}: no answer within {timeout_s:g} s ({e!r})",
                             hint="raise --timeout, or lower --max-tokens") from None
    except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError, httpx.WriteError) as e:
        if retry and headers_s is None:
            raise _Stale() from e
        raise _fail(url, f"request to {path} failed", e) from None
    except httpx.HTTPError as e:
        raise _fail(url, f"request to {path} failed", e) from None
    end_s = time.perf_counter() - t0
    if "timings" not in final:
        raise RuntimeFailure(f"{url}{path}: the response carried no `timings`",
                             hint="moetune reads llama.cpp's own timings; is this a llama.cpp server?")
    return {
        "path": path,
        "t_unix_s": t_unix,
        "headers_s": headers_s,
        "end_s": end_s,
        "content_chunk_s": [round(x, 6) for x in content_s],
        "reasoning_chunk_s": [round(x, 6) for x in reasoning_s],
        "content_chars": content_chars,
        "reasoning_chars": reasoning_chars,
        "finish_reason": finish_reason or final.get("stop_type"),
        "timings": final["timings"],
        "usage": final.get("usage"),
        "tokens_cached": final.get("tokens_cached"),
        "tokens_evaluated": final.get("tokens_evaluated"),
    }
