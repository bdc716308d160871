"""What a serving result warns about, each warning with a remedy (pure).

The one that matters most is queueing: a server with fewer slots than concurrent requests runs
the extra requests one after another, so TTFT grows by whole generations while throughput
hardly moves and ITL stays flat (reference 004: ``--parallel 1`` at c=2 gave TTFT x7.5 and
throughput +12%). It is flagged before the run when the server's slot count is known, and from
the numbers (the signature against the lowest level) when it is not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# kinds, as hyperfine keeps its warnings in a small enum
QUEUEING = "queueing"
CLIENT_QUEUE = "client_queue"
ERRORS = "errors"
RETRIES = "retries"
CACHE_HIT = "cache_hit"
THINKING = "thinking"
SHORT_OUTPUT = "short_output"
PROMPT_MISMATCH = "prompt_mismatch"
SERVER_BUSY = "server_busy"
NO_SLOT_INFO = "no_slot_info"
SKIPPED = "skipped_prompts"


@dataclass(frozen=True, slots=True)
class Advice:
    kind: str
    message: str
    remedy: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _p(level: dict[str, Any], metric: str, q: str = "p50") -> float | None:
    v = (level.get(metric) or {}).get(q)
    return float(v) if isinstance(v, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def queueing_signature(level: dict[str, Any], base: dict[str, Any]) -> str | None:
    """The numbers of queueing against a lower level: TTFT up at least 2x, throughput about the
    same (not down by more than 20%, up by less than half the added concurrency), ITL within 20-25%."""
    c, c0 = level["concurrency"], base["concurrency"]
    ttft = _ratio(_p(level, "ttft_ms"), _p(base, "ttft_ms"))
    tput = _ratio(level.get("output_tok_s"), base.get("output_tok_s"))
    itl = _ratio(_p(level, "itl_ms"), _p(base, "itl_ms"))
    if c <= c0 or ttft is None or tput is None or itl is None:
        return None
    if ttft >= 2 and 0.8 <= tput < 1 + 0.5 * (c / c0 - 1) and 0.8 <= itl <= 1.25:
        return (f"against c={c0}: TTFT x{ttft:.1f}, output tok/s x{tput:.2f}, ITL x{itl:.2f} "
                "(flat ITL with rising TTFT is queueing, not batching)")
    return None


def level_advice(level: dict[str, Any], *, slots: int | None, base: dict[str, Any] | None,
                 prefix_cache: bool) -> list[Advice]:
    out: list[Advice] = []
    c = level["concurrency"]
    signature = queueing_signature(level, base) if base is not None else None
    ttft, wait = _p(level, "ttft_ms"), _p(level, "server_wait_ms")
    evidence = f"TTFT p50 {ttft:.0f} ms" if ttft is not None else ""
    if evidence and wait is not None:
        evidence += f", of which {max(wait, 0):.0f} ms before the server started the prompt"
    remedy = (f"start llama-server with --parallel {c} and -c {c} x the per-slot context you need "
              f"(a plan: --match-slots), or keep --concurrency at or below the slot count")
    if slots is not None and c <= slots:
        signature = None  # enough slots: whatever slowed the level, it was not slot queueing
    if slots is not None and c > slots:
        msg = (f"c={c} exceeds the server's {slots} slot{'s' if slots != 1 else ''}: {c - slots} request(s) at a "
               f"time wait in the server's queue, so TTFT includes queueing")
        msg += f" (measured: {evidence}" + (f"; {signature})" if signature else ")") if evidence else ""
        out.append(Advice(QUEUEING, msg, remedy))
    elif signature is not None:
        out.append(Advice(QUEUEING, f"c={c} shows the queueing signature {signature}", remedy))
    elif slots is None and wait is not None and ttft and wait > max(50.0, 0.5 * ttft):
        out.append(Advice(QUEUEING, f"c={c}: requests queue in the server before their prompt is processed "
                                    f"({evidence})", remedy))
    sw = _p(level, "slot_wait_ms", "p90")
    if level.get("rate") and sw is not None and sw > 10:
        out.append(Advice(CLIENT_QUEUE,
                          f"c={c}: requests waited for a client slot (p90 {sw:.0f} ms): the offered rate "
                          f"{level['rate']}/s is more than {c} streams complete, and latency_ms includes this "
                          "queue", "lower --rate or raise --concurrency"))
    errors: dict[str, int] = level.get("errors") or {}
    if errors:
        n = sum(errors.values())
        kinds = ", ".join(f"{k} x{v}" for k, v in errors.items())
        out.append(Advice(ERRORS, f"c={c}: {n} of {level['requests']} requests failed ({kinds}); they are kept "
                                  "as samples and left out of the latency figures", _error_remedy(errors)))
    if level.get("retries"):
        out.append(Advice(RETRIES, f"c={c}: {level['retries']} request(s) were sent again on a new connection: "
                                   "the server closed a kept-alive connection as it was reused; none was lost",
                          "nothing to do (llama-server closes a connection after each streamed response, and "
                          "idle ones after 5 s); TTFT counts from the attempt that was answered"))
    if level.get("cached_tokens") and not prefix_cache:
        out.append(Advice(CACHE_HIT, f"c={c}: {level['cached_tokens']} prompt tokens came from the server's prefix "
                                     "cache although every prompt was unique, so TTFT is lower than for a "
                                     "cold prompt", "check the server honours cache_prompt=false"))
    out_tok, reason = level.get("output_tokens") or 0, level.get("reasoning_tokens") or 0
    if out_tok and reason > 0.5 * out_tok:
        ttfc = _p(level, "ttfc_ms")
        out.append(Advice(THINKING, f"c={c}: {100 * reason / out_tok:.0f}% of output tokens were reasoning; TTFT "
                                    "counts the first reasoning token" + (
                                        f", the first answer token came at {ttfc:.0f} ms (p50)" if ttfc else ""),
                          "pass --thinking off to measure answers only, or read ttfc_ms"))
    if level.get("short_outputs"):
        out.append(Advice(SHORT_OUTPUT, f"c={c}: {level['short_outputs']} request(s) produced fewer tokens than "
                                        "asked (a full slot context or a stop)",
                          "check prompt + output fits the per-slot context"))
    if level.get("prompt_token_mismatches"):
        out.append(Advice(PROMPT_MISMATCH, f"c={c}: for {level['prompt_token_mismatches']} request(s) the server "
                                           "counted a different prompt length than /tokenize gave",
                          "the chat template may depend on request fields; input lengths are approximate"))
    return out


def _error_remedy(errors: dict[str, int]) -> str:
    kinds = " ".join(errors)
    if "exceed_context" in kinds:
        return "shorten --input-len/--output-len, or raise the per-slot context (-c = slots x context)"
    if "timeout" in kinds:
        return "raise --timeout, or lower the load"
    if "http_5" in kinds:
        return "read the server's log"
    if "after_retries" in kinds or "connect" in kinds or "reset" in kinds or "truncated" in kinds:
        return "the server dropped connections: read its log (a crash, or too few --threads-http)"
    return "read the error details in the stored samples (moetune serve-report RUN --json)"


def run_advice(server: dict[str, Any], concurrency: list[int], skipped_overlong: int) -> list[Advice]:
    out: list[Advice] = []
    if server.get("slots") is None:
        out.append(Advice(NO_SLOT_INFO, "the server does not report its slots (/props): queueing can only be "
                                        "recognised from the numbers",
                          "run against llama-server, or compare levels with the same slot count"))
    busy = server.get("busy_slots")
    if busy:
        out.append(Advice(SERVER_BUSY, f"{busy} server slot(s) were busy when the benchmark started: another "
                                       "client shares the server", "stop other clients for clean numbers"))
    if skipped_overlong:
        out.append(Advice(SKIPPED, f"{skipped_overlong} dataset prompt(s) were skipped: prompt + output is longer "
                                   f"than the per-slot context ({server.get('n_ctx_slot')} tokens)",
                          "raise the server's context per slot to include them"))
    return out


NOTES = frozenset({RETRIES})  # told, but not warnings: they change no figure


def annotate(levels: list[dict[str, Any]], *, slots: int | None, prefix_cache: bool) -> list[list[Advice]]:
    """Fill each level's ``warnings`` (message strings), ``notes`` and ``advice``; return the advice."""
    base = min(levels, key=lambda lv: lv["concurrency"], default=None)
    out = []
    for lv in levels:
        lv_slots = (lv.get("server") or {}).get("slots", slots)  # a plan relaunched per level: its own
        adv = level_advice(lv, slots=lv_slots, base=base if base is not lv else None, prefix_cache=prefix_cache)
        lv["warnings"] = [a.message for a in adv if a.kind not in NOTES]
        lv["notes"] = [a.message for a in adv if a.kind in NOTES]
        lv["advice"] = [a.to_json() for a in adv]
        out.append(adv)
    return out
