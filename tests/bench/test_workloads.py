"""Workloads: the reference requests verbatim, thinking on/off, exact lengths, prompt files, depths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.bench.single.workloads import (
    LONG_OPENAPI_PROMPT,
    SHORT_JSON_PROMPT,
    Workload,
    chat_body,
    completion_body,
    depth_prompts,
    expand,
    load_prompt_file,
)
from moetune.errors import InputError

# reference/000, "短い出力テスト" and "長い出力テスト"
REF_SHORT = {
    "model": "GLM-5.1",
    "messages": [{"role": "user", "content": SHORT_JSON_PROMPT}],
    "max_tokens": 256,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 45,
    "min_p": 0.01,
    "chat_template_kwargs": {"enable_thinking": False},
}


def test_reference_workloads_send_the_reference_requests() -> None:
    short, long = expand(["reference"], [])
    body = chat_body(short, cache_prompt=False)
    for k, v in REF_SHORT.items():
        if k != "model":
            assert body[k] == v, k
    assert body["stream"] is True and body["cache_prompt"] is False
    assert "ignore_eos" not in body
    lb = chat_body(long, cache_prompt=True)
    assert lb["max_tokens"] == 2048 and lb["messages"][0]["content"] == LONG_OPENAPI_PROMPT
    assert "Bearer token" in LONG_OPENAPI_PROMPT and "license" in SHORT_JSON_PROMPT


@pytest.mark.parametrize(
    ("thinking", "names", "flags"),
    [
        ("off", ["short-json"], [False]),
        ("on", ["short-json+think"], [True]),
        ("both", ["short-json", "short-json+think"], [False, True]),
        ("template", ["short-json"], [None]),
    ],
)
def test_thinking_switch(thinking: str, names: list[str], flags: list[bool | None]) -> None:
    ws = expand(["short-json"], [], thinking=thinking)
    assert [w.name for w in ws] == names
    for w, f in zip(ws, flags, strict=True):
        kwargs = chat_body(w, cache_prompt=False).get("chat_template_kwargs")
        assert (kwargs or {}).get("enable_thinking") == f


def test_exact_output_lengths() -> None:
    (w,) = expand(["long-openapi"], [], max_tokens=64, ignore_eos=True)
    body = chat_body(w, cache_prompt=False)
    assert (body["max_tokens"], body["n_predict"], body["ignore_eos"]) == (64, 64, True)


def test_prompt_file_text_and_request_body(tmp_path: Path) -> None:
    (tmp_path / "review.txt").write_text("Review this diff.")
    (tmp_path / "curl.json").write_text(json.dumps(REF_SHORT))
    (tmp_path / "msgs.json").write_text(
        json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    )
    t = load_prompt_file(tmp_path / "review.txt")
    assert (t.name, t.messages, t.max_tokens) == ("review", ({"role": "user", "content": "Review this diff."},), 256)
    c = load_prompt_file(tmp_path / "curl.json")
    assert (c.name, c.max_tokens, c.thinking) == ("curl", 256, False)
    assert c.sampling == {"temperature": 0.7, "top_p": 0.95, "top_k": 45, "min_p": 0.01}
    assert "model" not in chat_body(c, cache_prompt=False)
    assert len(load_prompt_file(tmp_path / "msgs.json").messages) == 2


@pytest.mark.parametrize(("content", "match"), [("", "empty"), ("{", "not valid JSON"), ('{"x": 1}', "messages")])
def test_bad_prompt_files(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / ("p.txt" if content == "" else "p.json")
    p.write_text(content)
    with pytest.raises(InputError, match=match):
        load_prompt_file(p)
    with pytest.raises(InputError, match="no such prompt file"):
        load_prompt_file(tmp_path / "missing.txt")


def test_depth_workloads_and_their_prompts() -> None:
    ws = expand([], [], depths=[0, 512], pp_tokens=64, tg_tokens=16)
    assert [(w.name, w.kind, w.depth, w.pp_tokens, w.max_tokens, w.ignore_eos) for w in ws] == [
        ("d0", "depth", 0, 64, 16, True),
        ("d512", "depth", 512, 64, 16, True),
    ]
    filler = list(range(10, 60))
    fill, blocks = depth_prompts(filler, 512, 64, 3)
    assert len(fill) == 512 and fill[:3] == [10, 11, 12]
    assert [len(b) for b in blocks] == [64, 64, 64]
    assert len({tuple(b) for b in blocks}) == 3  # each request's new tokens differ
    body = completion_body(fill + blocks[0], 16)
    assert (body["n_predict"], body["ignore_eos"], body["id_slot"], body["cache_prompt"]) == (16, True, 0, True)


def test_bad_choices() -> None:
    with pytest.raises(InputError, match="no workload"):
        expand([], [])
    with pytest.raises(InputError, match="unknown workload"):
        expand(["nope"], [])
    with pytest.raises(InputError, match="depths"):
        expand([], [], depths=[-1])
    with pytest.raises(InputError, match="repeat"):
        expand(["short-json", "short-json"], [])


def test_round_trip() -> None:
    (w,) = expand(["short-json"], [], thinking="on")
    assert Workload.from_json(json.loads(json.dumps(w.to_json()))) == w


def test_default_thinking_is_each_workloads_own(tmp_path: Path) -> None:
    body = dict(REF_SHORT, chat_template_kwargs={"enable_thinking": True})
    (tmp_path / "think.json").write_text(json.dumps(body))
    ws = expand(["short-json"], [tmp_path / "think.json"])
    assert [(w.name, w.thinking) for w in ws] == [("short-json", False), ("think+think", True)]


def test_tg_is_predicted_at_the_mean_context_of_the_generated_tokens() -> None:
    from moetune.bench.single.workloads import CHAT, DEPTH, Workload

    assert Workload(name="d512", kind=DEPTH, max_tokens=128, depth=512, pp_tokens=256).tg_depth == 831.5
    assert Workload(name="exact", kind=CHAT, max_tokens=101, ignore_eos=True).tg_depth == 50.0  # the reply's own tokens
    assert Workload(name="short", kind=CHAT, max_tokens=101).tg_depth is None  # the reply may stop early: at depth 0
