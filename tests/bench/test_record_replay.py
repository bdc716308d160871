"""`moetune record` (the proxy, run as the CLI in its own process) in front of a real llama-server
on a generated model, the vLLM mock and a scripted upstream; `serve-bench --replay` of what it
wrote, against llama-server (through a second recorder, to see exactly what was replayed) and the
vLLM mock; its exits, errors and signals."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.run.process import end
from moetune.store.db import ResultsDB
from tests.bench.vllm_mock import MockConfig, vllm_mock
from tests.helpers import Server, free_port, llama_server, run_cli

pytestmark = pytest.mark.server

REPLAY_ADDED = ("stream", "stream_options", "timings_per_token")  # what a replay sets in every body


@dataclass
class Recording:
    proc: subprocess.Popen[bytes]
    url: str
    path: Path
    err: Path

    def stop(self, sig: int | None = signal.SIGTERM) -> tuple[int, dict[str, Any]]:
        """Signal it (unless ``sig`` is None: it was signalled); its exit code and the summary it printed (--json)."""
        if sig is not None:
            self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=30)
        return self.proc.returncode, json.loads(out) if out.strip() else {}

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]


@contextmanager
def recorder(upstream: str, path: Path, *args: str) -> Iterator[Recording]:
    """`moetune record` on a free loopback port in front of ``upstream``, writing ``path``."""
    err = path.with_suffix(".err")
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
                upstream,
                "-o",
                str(path),
                "--json",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=f,
        )
    try:
        deadline = time.monotonic() + 30
        while not (m := re.search(r"recording (http://\S+) ->", err.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"record did not start (exit {proc.poll()}):\n{err.read_text()}")
            time.sleep(0.05)
        yield Recording(proc, m[1], path, err)
    finally:
        end(proc)


def client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=60)


def stream(
    c: httpx.Client, url: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[httpx.Response, bytes]:
    with c.stream("POST", url + path, json=body) as r:
        return r, b"".join(r.iter_raw())


@pytest.fixture(scope="module")
def server(models: Path, tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Server]:
    model = models / "record-qwen3moe.gguf"
    if not model.exists():
        generate(model, "qwen3moe", Dims(n_layer=2), "f16")
    log = tmp_path_factory.mktemp("record") / "server.log"
    with llama_server(bin_dir, model, log, "-nr", "--parallel", "2", "-c", "4096", "-t", "1") as s:
        yield s


@pytest.fixture(scope="module")
def vllm() -> Iterator[str]:
    with vllm_mock(MockConfig(ttft_ms=5.0, itl_ms=2.0)) as url:
        yield url


# ids, creation times and the server's timings differ between two answers to the same request
VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)|"timings":\{[^{}]*\}')


def masked(body: bytes) -> bytes:
    return VOLATILE.sub(lambda m: m[0].split(b":", 1)[0] + b":*", body)


def test_a_stream_passes_through_unchanged(server: Server, tmp_path: Path) -> None:
    """The same deterministic request (greedy, seeded, ignore_eos, no prompt cache), sent directly and
    through the proxy: the body bytes a client reads (chunked framing removed) are equal once each
    event's ``id``, ``created`` and ``timings`` values are masked; the status and every end-to-end
    header are equal (Keep-Alive, a hop-by-hop header, stays behind)."""
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "stream": True,
        "max_tokens": 24,
        "temperature": 0,
        "seed": 42,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream_options": {"include_usage": True},
    }
    with recorder(server.url, tmp_path / "s.jsonl") as rec, client() as c:
        direct, direct_body = stream(c, server.url, body)
        proxied, proxied_body = stream(c, rec.url, body)
        code, _ = rec.stop()
    assert code == 0
    assert proxied.status_code == direct.status_code == 200
    assert direct_body.count(b"data: ") >= 10 and b"[DONE]" in direct_body
    assert masked(proxied_body) == masked(direct_body)
    assert proxied_body != direct_body  # the masked fields did differ: two answers were compared

    def end_to_end(r: httpx.Response) -> list[tuple[str, str]]:
        return [(k, v) for k, v in r.headers.multi_items() if k not in ("keep-alive", "connection", "date")]

    assert end_to_end(proxied) == end_to_end(direct) and "keep-alive" not in proxied.headers
    (line,) = rec.lines()
    assert line["completion_tokens"] == 24 and line["tokens_from"] == "usage" and line["stream"]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Scripted(socketserver.BaseRequestHandler):
    """An upstream with a fixed streamed answer, written in two parts: the second only once the test
    says the first reached the client through the proxy (or after 5 s). Keeps its connection for
    more requests, and records each request as it came."""

    HEAD = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Keep-Alive: timeout=5\r\nX-Upstream: yes\r\n\r\n"
    )
    PART1 = chunk(b'data: {"choices":[{"delta":{"content":"A"}}]}\n\n')
    PART2 = (
        chunk(
            b'data: {"choices":[{"delta":{"content":"B"},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
        )
        + chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )
    requests: ClassVar[list[bytes]] = []
    first_seen = threading.Event()
    held: ClassVar[list[bool]] = []  # per answer: the second part waited for the client to see the first

    def handle(self) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = self.request.recv(65536)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            n = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            while len(buf) < n:
                buf += self.request.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + buf[:n])
            buf = buf[n:]
            self.first_seen.clear()
            self.request.sendall(self.HEAD + self.PART1)
            self.held.append(self.first_seen.wait(5))
            self.request.sendall(self.PART2)


def read_answer(sock: socket.socket, seen_first: threading.Event) -> bytes:
    out = b""
    while not out.endswith(b"0\r\n\r\n"):
        data = sock.recv(65536)
        assert data, out
        out += data
        if Scripted.PART1 in out:
            seen_first.set()
    return out


def test_the_proxy_relays_bytes_as_they_come_and_the_request_as_it_was(tmp_path: Path) -> None:
    """Against a scripted upstream, on one client connection: the answer's bytes, chunk framing
    included, are exactly the upstream's (its head without Keep-Alive), and its first event reaches
    the client while the upstream still holds the rest (no buffering). The request reaches the
    upstream with its method, path, query, headers and body, Host naming the upstream and the
    hop-by-hop headers gone; a chunked body with Expect: 100-continue arrives whole, with a length."""
    Scripted.requests.clear()
    Scripted.held.clear()
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Scripted) as up:
        threading.Thread(target=up.serve_forever, daemon=True).start()
        upstream = f"http://127.0.0.1:{up.server_address[1]}/prefix"
        try:
            with recorder(upstream, tmp_path / "s.jsonl") as rec:
                port = int(rec.url.rsplit(":", 1)[1])
                body = b'{"messages":[{"role":"user","content":"hi"}],"stream":true}'
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(
                        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer k\r\n"
                        b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    first = read_answer(s, Scripted.first_seen)
                    s.sendall(
                        b"POST /v1/completions HTTP/1.1\r\nHost: proxy\r\nExpect: 100-continue\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n"
                    )
                    assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
                    s.sendall(b'5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n')
                    second = read_answer(s, Scripted.first_seen)
                code, summary = rec.stop()
        finally:
            up.shutdown()
    expected = Scripted.HEAD.replace(b"Keep-Alive: timeout=5\r\n", b"") + Scripted.PART1 + Scripted.PART2
    assert first == expected and second == expected
    assert Scripted.held == [True, True]
    host = f"Host: 127.0.0.1:{upstream.split(':')[2].split('/')[0]}".encode()
    assert Scripted.requests[0] == (
        b"POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\n" + host + b"\r\n"
        b"Authorization: Bearer k\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert (
        Scripted.requests[1]
        == b"POST /prefix/v1/completions HTTP/1.1\r\n" + host + b'\r\nContent-Length: 7\r\n\r\n{"a":1}'
    )
    assert code == 0 and summary["requests"] == 2
    lines = rec.lines()
    assert [(x["seq"], x["path"], x["query"], x["body"]) for x in lines] == [
        (0, "/v1/chat/completions", "x=1", json.loads(body)),
        (1, "/v1/completions", "", {"a": 1}),
    ]
    for x in lines:
        assert x["status"] == 200 and x["completion_tokens"] == 2 and x["tokens_from"] == "usage"
        assert x["prompt_tokens"] == 3 and x["finish_reason"] == "stop" and x["events"] == 2
        p = x["proxy"]
        assert p["pieces"] >= 2 and 0 <= p["first_byte_ms"] < 1000 and 0 <= p["forward_ms"] < 1000
    assert lines[0]["proxy"]["connect_ms"] is not None and lines[1]["proxy"]["connect_ms"] is None  # reused


LLAMA_SESSION: list[tuple[str, dict[str, Any] | None]] = [
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "First question."}],
            "stream": True,
            "max_tokens": 8,
            "ignore_eos": True,
            "temperature": 0,
        },
    ),
    ("/v1/models", None),
    (
        "/v1/completions",
        {
            "prompt": "Once upon a time",
            "stream": True,
            "max_tokens": 6,
            "ignore_eos": True,
            "model": "named-by-the-client",
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Second question."}],
            "max_tokens": 5,
            "ignore_eos": True,
        },
    ),  # not streamed
]
LONG = 1500  # tokens: long enough for the second of two streams to start before the first ends
PARALLEL = [
    {
        "messages": [{"role": "user", "content": f"Parallel {i}."}],
        "stream": True,
        "max_tokens": LONG,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    for i in range(2)
]


def two_at_once(url: str) -> None:
    """The PARALLEL requests, the second sent once the first has begun to stream."""
    begun = threading.Event()

    def first() -> None:
        with client() as c, c.stream("POST", url + "/v1/chat/completions", json=PARALLEL[0]) as r:
            it = r.iter_raw()
            next(it)
            begun.set()
            assert b"[DONE]" in b"".join(it)

    def second() -> None:
        assert begun.wait(30)
        with client() as c:
            _send(c, url, "/v1/chat/completions", PARALLEL[1])

    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(first), pool.submit(second)]:
            f.result()


def _send(c: httpx.Client, url: str, path: str, body: dict[str, Any] | None) -> None:
    if body is None:
        assert c.get(url + path).status_code == 200
    elif body.get("stream"):
        r, data = stream(c, url, body, path)
        assert r.status_code == 200 and b"[DONE]" in data
    else:
        assert c.post(url + path, json=body).status_code == 200


def replayed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if x["method"] == "POST" and x["path"].endswith("completions")]


def test_record_then_replay_reproduces_the_session(server: Server, tmp_path: Path) -> None:
    """A session (chat and completions, streamed or not, a GET, two streams at once) recorded in front
    of llama-server: one line per request with its counts, a clean exit on SIGTERM. Replayed at 1x
    through a second recorder: the same requests (path, order, body but the fields a replay sets,
    the model the server lists for one it does not), at the recorded offsets, with the recorded
    token counts; the serve-bench document has one level and says what it replayed."""
    a = tmp_path / "a.jsonl"
    with recorder(server.url, a) as rec, client() as c:
        for path, body in LLAMA_SESSION:
            _send(c, rec.url, path, body)
            time.sleep(0.25)
        two_at_once(rec.url)
        code, summary = rec.stop()
    assert code == 0, rec.err.read_text()
    lines = rec.lines()
    assert sorted(x["seq"] for x in lines) == list(range(6))
    want = {0: 8, 2: 6, 3: 5, 4: LONG, 5: LONG}
    assert {x["seq"]: x["completion_tokens"] for x in lines if x["seq"] != 1} == want
    assert [x["tokens_from"] for x in sorted(lines, key=lambda x: x["seq"])] == [
        "timings",
        None,
        "usage",
        "usage",
        "usage",
        "usage",
    ]
    assert all(x["status"] == 200 and x["error"] is None and x["proxy"]["first_byte_ms"] is not None for x in lines)
    assert (
        summary["requests"] == 6 and summary["concurrency"] == 2 and summary["completion_tokens"] == sum(want.values())
    )
    assert summary["proxy_ms"]["piece"]["n"] > 10 and "added by the proxy" in rec.err.read_text()

    b = tmp_path / "b.jsonl"
    with recorder(server.url, b) as again:
        r = run_cli("serve-bench", again.url, "--replay", str(a), "--json")
        assert r.exit_code == 0, r.stderr
        again.stop()
    doc = json.loads(r.stdout)
    (level,) = doc["levels"]
    assert level["concurrency"] == 2 and level["requests"] == level["ok"] == 5
    assert level["output_tokens"] == sum(want.values()) and level["errors"] == {}
    w = doc["run"]["workload"]["replay"]
    assert w["file"] == str(a.resolve()) and w["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest()
    assert w["requests"] == 5 and w["skipped"] == 1 and w["speed"] == "1x" and w["recorded_concurrency"] == 2
    assert doc["run"]["kind"] == "serve-bench" and doc["run"]["warnings"] == []
    assert "sent as" in r.stderr  # the completion named a model llama-server does not list

    rec_a = sorted(replayed(lines), key=lambda x: x["t_start_s"])
    rec_b = sorted(replayed(again.lines()), key=lambda x: x["t_start_s"])
    served = httpx.get(server.url + "/v1/models", trust_env=False).json()["data"][0]["id"]
    expected = [
        (
            {k: (served if k == "model" else v) for k, v in x["body"].items() if k not in REPLAY_ADDED},
            x["path"],
            x["completion_tokens"],
        )
        for x in rec_a
    ]
    got = [
        ({k: v for k, v in y["body"].items() if k not in REPLAY_ADDED}, y["path"], y["completion_tokens"])
        for y in rec_b
    ]
    assert got[:3] == expected[:3]  # one after another: in order
    assert sorted(map(json.dumps, got[3:])) == sorted(map(json.dumps, expected[3:]))  # the two at once
    assert all(y["body"]["stream"] is True and y["body"]["stream_options"]["include_usage"] for y in rec_b)
    starts_a = [x["t_start_s"] - rec_a[0]["t_start_s"] for x in rec_a]
    starts_b = [x["t_start_s"] - rec_b[0]["t_start_s"] for x in rec_b]
    assert max(abs(p - q) for p, q in zip(starts_a, starts_b, strict=True)) < 0.2, (starts_a, starts_b)

    with ResultsDB.open() as db:
        run = db.run(doc["run"]["id"])
        assert run.status == "done" and len(db.samples(run.id)) == 5
    fast = run_cli("serve-bench", server.url, "--replay", str(a), "--speed", "max", "--concurrency", "1", "--json")
    assert fast.exit_code == 0, fast.stderr
    fast_doc = json.loads(fast.stdout)
    (lv,) = fast_doc["levels"]
    assert lv["ok"] == 5 and lv["concurrency"] == 1 and lv["output_tokens"] == sum(want.values())
    with ResultsDB.open() as db:
        samples = sorted(db.samples(fast_doc["run"]["id"]), key=lambda x: x["index"])
    # one at a time, each as soon as the one before ended: not the recorded pauses of 0.25 s
    assert [x["index"] for x in samples] == list(range(5))
    assert max(b["t_sched"] - a["t_end"] for a, b in itertools.pairwise(samples)) < 0.1
    report = run_cli("serve-report", str(doc["run"]["id"]), "--json")
    assert json.loads(report.stdout)["levels"][0]["output_tokens"] == level["output_tokens"]


def test_replay_against_the_vllm_mock_and_a_changed_count(vllm: str, tmp_path: Path) -> None:
    """A session recorded in front of the vLLM mock (usage asked for, chat and completions) replays
    against it with the same prompts, fields and token counts; a recording whose count was edited
    gets the replay_tokens warning."""
    model = "mock-org/Mock-MoE-30B"
    bodies = [
        (
            "/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": "a b c"}],
                "stream": True,
                "max_tokens": 7,
                "stream_options": {"include_usage": True},
            },
        ),
        (
            "/v1/completions",
            {
                "model": model,
                "prompt": "x y",
                "stream": True,
                "max_tokens": 5,
                "stream_options": {"include_usage": True},
            },
        ),
    ]
    s = tmp_path / "v.jsonl"
    with recorder(vllm, s) as rec, client() as c:
        before = len(httpx.get(vllm + "/mock/log", trust_env=False).json())
        for path, body in bodies:
            _send(c, rec.url, path, body)
        assert rec.stop()[0] == 0
    assert [x["completion_tokens"] for x in sorted(rec.lines(), key=lambda x: x["seq"])] == [7, 5]
    r = run_cli("serve-bench", vllm, "--replay", str(s), "--speed", "max", "--json")
    assert r.exit_code == 0, r.stderr
    (lv,) = json.loads(r.stdout)["levels"]
    assert lv["ok"] == 2 and lv["output_tokens"] == 12 and lv["itl_unknown"] == 0
    log = httpx.get(vllm + "/mock/log", trust_env=False).json()[before:]
    recorded, replay = log[:2], log[2:]
    assert [(e["chat"], e["prompt"], e["model"], e["completion_tokens"]) for e in replay] == [
        (e["chat"], e["prompt"], e["model"], e["completion_tokens"]) for e in recorded
    ]
    assert [set(e["fields"]) - set(REPLAY_ADDED) for e in replay] == [set(b) - set(REPLAY_ADDED) for _, b in bodies]
    edited = tmp_path / "edited.jsonl"
    lines = s.read_text().splitlines()
    first = json.loads(lines[0])
    first["completion_tokens"] = 99
    edited.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    r = run_cli("serve-bench", vllm, "--replay", str(edited), "--speed", "max", "--json")
    assert r.exit_code == 0 and "another number of tokens" in r.stderr
    assert [a["code"] for a in json.loads(r.stdout)["run"]["advice"]] == [
        "no_slot_info",
        "no_server_timings",
        "replay_tokens",
    ]


def test_redacted_log_keeps_lengths_and_forwards_the_real_text(vllm: str, tmp_path: Path) -> None:
    secret = "The launch code is swordfish, tell nobody"
    body = {
        "messages": [{"role": "user", "content": secret}],
        "stream": True,
        "max_tokens": 3,
        "stream_options": {"include_usage": True},
    }
    with recorder(vllm, tmp_path / "r.jsonl", "--redact") as rec, client() as c:
        _send(c, rec.url, "/v1/chat/completions", body)
        _send(c, rec.url, "/v1/completions", {"prompt": secret, "max_tokens": 2})
        assert rec.stop()[0] == 0
    text = rec.path.read_text()
    assert "swordfish" not in text and "launch" not in text
    chat, comp = sorted(rec.lines(), key=lambda x: x["seq"])
    assert len(chat["body"]["messages"][0]["content"]) == len(secret) and chat["redacted"]
    assert len(comp["body"]["prompt"]) == len(secret) and chat["completion_tokens"] == 3
    log = httpx.get(vllm + "/mock/log", trust_env=False).json()
    assert "swordfish" in log[-2]["prompt"] and log[-1]["prompt"] == secret  # the upstream got the real text


def test_sigterm_lets_a_stream_in_flight_end_and_the_file_is_complete(vllm: str, tmp_path: Path) -> None:
    body = {
        "messages": [{"role": "user", "content": "long"}],
        "stream": True,
        "max_tokens": 400,
        "stream_options": {"include_usage": True},
    }
    with recorder(vllm, tmp_path / "t.jsonl") as rec, client() as c:
        _send(c, rec.url, "/v1/chat/completions", {**body, "max_tokens": 4})
        with c.stream("POST", rec.url + "/v1/chat/completions", json=body) as r:
            it = r.iter_raw()
            next(it)  # the stream has begun (it takes about 0.8 s)
            rec.proc.send_signal(signal.SIGTERM)
            rest = b"".join(it)
        code, summary = rec.stop(None)
    assert code == 0 and b"[DONE]" in rest
    assert "stopping: 1 request(s) in flight" in rec.err.read_text()
    lines = rec.lines()
    assert [x["completion_tokens"] for x in lines] == [4, 400] and summary["requests"] == 2
    # and a second signal cuts what is in flight: logged as interrupted
    with (
        recorder(vllm, tmp_path / "u.jsonl") as rec,
        client() as c,
        c.stream("POST", rec.url + "/v1/chat/completions", json=body) as r,
    ):
        it = r.iter_raw()
        next(it)
        rec.proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        code, _ = rec.stop(signal.SIGINT)
    assert code == 0
    (line,) = rec.lines()
    assert line["error"] == "interrupted" and line["completion_tokens"] < 400


def test_a_client_that_leaves_stops_the_upstream_too(vllm: str, tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "long"}], "stream": True, "max_tokens": 2000}
    with recorder(vllm, tmp_path / "c.jsonl") as rec:
        with client() as c, c.stream("POST", rec.url + "/v1/chat/completions", json=body) as r:
            next(r.iter_raw())
        time.sleep(0.5)  # the mock would need 4 s for all of it
        assert rec.stop()[0] == 0
    (line,) = rec.lines()
    assert line["error"] == "client_closed" and line["completion_tokens"] < 2000
    entry = httpx.get(vllm + "/mock/log", trust_env=False).json()[-1]
    assert entry["max_tokens"] == 2000 and sum(entry["chunks"]) < 2000  # it stopped writing


def test_an_unreachable_upstream_is_a_502_and_a_line(tmp_path: Path) -> None:
    with recorder(f"http://127.0.0.1:{free_port()}", tmp_path / "x.jsonl") as rec, client() as c:
        r = c.post(rec.url + "/v1/chat/completions", json={"messages": []})
        assert rec.stop()[0] == 0
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_unreachable"
    (line,) = rec.lines()
    assert line["status"] == 502 and line["error"] == "upstream_unreachable"


def test_bad_input_exits_2_and_a_port_in_use_1(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    for args, word in [
        (("--listen", "nonsense"), "no port"),
        (("--listen", "127.0.0.1:99999"), "0 to 65535"),
        (("--upstream", "not-a-url"), "not an http(s) URL"),
        (("--upstream", "ftp://127.0.0.1:21"), "not an http(s) URL"),
        (("--upstream", "http://127.0.0.1:notaport"), "not an http(s) URL"),
    ]:
        kw = dict(zip(args[::2], args[1::2], strict=True))
        r = run_cli(
            "record",
            "--listen",
            kw.get("--listen", "127.0.0.1:0"),
            "--upstream",
            kw.get("--upstream", "http://127.0.0.1:8080"),
            "-o",
            str(out),
        )
        assert r.exit_code == 2 and word in r.stderr, (args, r.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = run_cli(
            "record",
            "--listen",
            f"127.0.0.1:{taken.getsockname()[1]}",
            "--upstream",
            "http://127.0.0.1:1",
            "-o",
            str(out),
        )
    assert r.exit_code == 1 and "in use" in r.stderr and not out.exists()
    out.write_text('{"seq": 0}\n')
    r = run_cli("record", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "-o", str(out))
    assert r.exit_code == 2 and "--force" in r.stderr
    # serve-bench --replay: options that make their own prompts, a bad speed, files that are not sessions
    garbage, empty = tmp_path / "garbage.jsonl", tmp_path / "none.jsonl"
    garbage.write_text("not json\n{}\n")
    empty.write_text(json.dumps({"seq": 0, "method": "GET", "path": "/v1/models", "t_start_s": 0}) + "\n")
    for args, word in [
        (("--replay", str(out), "--input-len", "10"), "drop --input-len"),
        (("--replay", str(out), "--speed", "fast"), "--speed"),
        (("--speed", "2x"), "add --replay"),
        (("--replay", str(garbage)), "line 1"),
        (("--replay", str(empty)), "no chat or completions"),
        (("--replay", str(out), "-C", "1,2"), "one --concurrency"),
    ]:
        r = run_cli("serve-bench", "http://127.0.0.1:1", *args)
        assert r.exit_code == 2 and word in r.stderr, (args, r.stderr)
