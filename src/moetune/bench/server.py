"""What a server says about itself before a benchmark, read the same way for every kind of run.

llama-server answers ``/health`` (503 while loading), ``/props``, ``/slots``, ``/tokenize`` and
``/apply-template``; an OpenAI-compatible server that is not llama-server (vLLM, SGLang, LM Studio,
Ollama) has none of them, and that is not an error: its :class:`~moetune.store.record.ServerInfo`
then says ``dialect="openai"``, names the model ``/v1/models`` lists, and its
:class:`~moetune.store.record.Capabilities` say what is missing. :func:`probe` is the one place
that decides them; the benchmarks ask ``info.caps``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moetune.bench.http.client import StreamingHttp
from moetune.errors import MoetuneError, RuntimeFailure
from moetune.store.record import Capabilities, ModelRef, ServerInfo

_NOT_STORED = ("chat_template", "default_generation_settings", "chat_template_caps")


def unreachable(url: str, what: str, e: object) -> RuntimeFailure:
    return RuntimeFailure(
        f"{url}: {what}: {e}", hint="is the server running there? check its log, or `curl URL/health`"
    )


async def probe(http: StreamingHttp, url: str) -> ServerInfo:
    """Check the server answers (``/health``, or ``/v1/models`` where there is no /health), read
    ``/props`` and ``/slots`` where they exist, and find what it offers beyond the OpenAI API
    (``caps``). Raises :class:`RuntimeFailure` when the server is unreachable or still loading."""
    try:
        status, _ = await http.get_json("/health")
        if status == 404:
            status, _ = await http.get_json("/v1/models")
    except Exception as e:
        raise unreachable(url, "cannot reach the server", f"{type(e).__name__}: {e}") from None
    if status == 503:
        raise RuntimeFailure(
            f"{url}: the server is still loading the model (/health answers 503)",
            hint="wait until /health answers 200, then run again",
        )
    if status != 200:
        raise unreachable(url, "/health", f"HTTP {status}")
    props = await _answer(http, "/props", None)
    tok = await _answer(http, "/tokenize", {"content": "a", "add_special": False})
    tmpl = await _answer(http, "/apply-template", {"messages": [{"role": "user", "content": "a"}]})
    tokenize = isinstance(tok, dict) and isinstance(tok.get("tokens"), list)
    apply_template = isinstance(tmpl, dict) and isinstance(tmpl.get("prompt"), str)
    if not isinstance(props, dict):
        return ServerInfo(
            url=url,
            model_alias=await _model_id(http),
            caps=Capabilities(tokenize=tokenize, apply_template=apply_template),
        )
    gen = props.get("default_generation_settings") or {}
    n_ctx = gen.get("n_ctx", props.get("n_ctx"))
    busy = None
    try:
        s_status, slots = await http.get_json("/slots")
        if s_status == 200 and isinstance(slots, list):
            busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
            ctxs = [s["n_ctx"] for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)]
            if ctxs:
                n_ctx = min(ctxs)
    except Exception:  # /slots is optional (--no-slots)
        pass
    total = props.get("total_slots")

    def text(key: str) -> str | None:
        return str(props[key]) if props.get(key) else None

    return ServerInfo(
        url=url,
        dialect="llama.cpp",
        build=text("build_info"),
        model_path=text("model_path"),
        model_alias=text("model_alias"),
        slots=total if isinstance(total, int) else None,
        n_ctx_slot=int(n_ctx) if isinstance(n_ctx, int | float) else None,
        busy_slots=busy,
        props={k: v for k, v in props.items() if k not in _NOT_STORED},
        caps=Capabilities(props=True, tokenize=tokenize, apply_template=apply_template, timings=True),
    )


async def _answer(http: StreamingHttp, path: str, doc: Any) -> Any:
    """The JSON a GET (``doc`` None) or POST of ``path`` answers with HTTP 200; None otherwise
    (absent, refused, or not JSON): what the probe reads a capability from."""
    try:
        status, body = await (http.get_json(path) if doc is None else http.post_json(path, doc))
    except Exception:
        return None
    return body if status == 200 else None


async def _model_id(http: StreamingHttp) -> str | None:
    """The first model ``/v1/models`` lists: the name requests to an OpenAI server must carry."""
    models = await _answer(http, "/v1/models", None)
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return str(first["id"]) if first.get("id") else None


async def tokenize(http: StreamingHttp, url: str, text: str, *, add_special: bool = False) -> list[int]:
    """Token ids of ``text`` by the server's own tokenizer (llama-server's ``/tokenize``)."""
    try:
        status, doc = await http.post_json("/tokenize", {"content": text, "add_special": add_special})
    except Exception as e:
        raise unreachable(url, "/tokenize failed", f"{type(e).__name__}: {e}") from None
    tokens: Any = doc.get("tokens") if isinstance(doc, dict) else None
    if status != 200 or not isinstance(tokens, list):
        raise unreachable(url, "/tokenize failed (depth workloads and exact prompt lengths need it)", f"HTTP {status}")
    return [int(t) for t in tokens]


def model_ref(model_path: str | None, *, name: str | None = None) -> ModelRef:
    """The served model's file and structural fingerprint, when the file is readable from here."""
    if not model_path:
        return ModelRef(name=name)
    from moetune.model.profile import fingerprint, load_profile

    p = Path(model_path)
    try:
        return ModelRef(str(p.resolve()), fingerprint(load_profile(p)), name)
    except (MoetuneError, OSError, ValueError) as e:
        return ModelRef(model_path, None, name, f"not readable here: {e}")
