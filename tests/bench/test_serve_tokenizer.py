"""serve-bench --tokenizer against a server without /tokenize (the vLLM mock, counting prompt tokens
with a real tokenizer of its own): prompts counted before sending, the chat template's overhead
measured by a probe, the predicted lengths checked against the server's usage afterwards.

The tokenizers are trained here, in milliseconds, on a few hundred words (no downloads)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.analysis.serve import summarize_level
from moetune.bench.analysis.warnings import annotate
from moetune.store.db import ResultsDB
from tests.bench import mock_server
from tests.bench.vllm_mock import MockConfig, template, vllm_mock
from tests.helpers import run_cli

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None,
    reason="needs the tokenizers package: pip install 'moetune[tokenizers]'",
)

CHATML = ("<s>", "<|im_start|>", "<|im_end|>")
TEXT = """\
Mixture-of-experts models route each token to a few experts out of many. The router scores every
expert, keeps the best few, and only their weights are read, so a model with hundreds of billions of
parameters decodes at about the speed of a much smaller dense one, as long as the experts sit in
memory somewhere the machine can reach quickly. Where they sit is the whole question: the attention
layers and the shared experts are small and busy, so they belong on the fastest device; the routed
experts are large and each is read rarely, so they can live in system memory, or on a second machine
reached over the network, and still be read fast enough. A prompt is processed in batches of
hundreds of tokens, which touch almost every expert, so prompt processing is limited by bandwidth to
wherever the experts are; generation touches only a few experts per token, so it is limited by
latency. Quantization shrinks the experts further: four bits per weight instead of sixteen, with a
small loss of quality that the benchmark measures instead of guessing. A server keeps several slots,
each a conversation with its own context; when more requests arrive than there are slots, they wait
in a queue, and the time to the first token grows while the rate of tokens stays flat. Caching the
prefix of a prompt saves the work of processing it again, when the next request starts the same way,
as an agent's requests do: the system prompt, the tools, the history of the session so far. A client
that drops the reasoning from the history changes the prefix and loses the cache. Measure, do not
guess: the numbers from one machine say little about another, and the numbers from a quiet machine
say little about a busy one. Café, naïve, Straße, データ, 日本語 and other words outside ASCII are
split into bytes by a byte-level tokenizer, several tokens each.
"""


def train(path: Path, vocab_size: int, *, specials: bool = True) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained on :data:`TEXT`, with a BOS added in front. With
    ``specials`` the ChatML markers are special tokens (one token each, as a real ChatML model has
    them); else they are plain text, and trained on as the mock's template wraps each word, so the
    BPE merges a message's last punctuation mark with the marker after it (``.<|``): one token less
    than the content and the template counted apart, as a chat-trained tokenizer can do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML if specials else CHATML[:1]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = TEXT.splitlines() if specials else [template([{"role": "user", "content": w}]) for w in TEXT.split()]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(path))
    return path


def count(path: Path, text: str) -> int:
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    train(d / "tokenizer.json", 600)
    train(d / "plain.json", 600, specials=False)
    train(d / "other.json", 262)  # another model's: hardly any merges
    return d


@pytest.fixture(scope="module")
def server(tok_dir: Path) -> Iterator[str]:
    """The vLLM mock counting prompts with tok_dir/tokenizer.json, ChatML markers special."""
    with vllm_mock(
        MockConfig(ttft_ms=5.0, pp_ms_per_token=0.0, itl_ms=1.0, tokenizer=str(tok_dir / "tokenizer.json"))
    ) as url:
        yield url


def mock_log(url: str) -> list[dict[str, Any]]:
    from tests.bench.test_openai_server import mock_log as read

    return read(url)


def serve_bench(*args: str) -> tuple[dict[str, Any], str]:
    r = run_cli("serve-bench", *args, "--json")
    assert r.exit_code == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc, r.stderr


def samples(doc: dict[str, Any]) -> list[dict[str, Any]]:
    with ResultsDB.open() as db:  # the default database, in the test's data directory
        return db.samples(int(doc["run"]["id"]))


def codes(advice: list[dict[str, Any]]) -> set[str]:
    return {a["code"] for a in advice}


def within_1pct(predicted: int, truth: int) -> bool:
    return abs(predicted - truth) <= 0.01 * truth


ARGS = ("-C", "1,2", "--requests", "4", "--input-len", "100", "--output-len", "6")


def test_synthetic_prompts_are_counted_by_the_tokenizer(server: str, tok_dir: Path) -> None:
    before = len(mock_log(server))
    doc, stderr = serve_bench(server, *ARGS, "--tokenizer", str(tok_dir / "tokenizer.json"))
    log = mock_log(server)[before:]
    probes = [e for e in log if not e["stream"]]
    streamed = [e for e in log if e["stream"]]
    # two probe requests (the overhead, and its check), whatever the number of prompts; none sent again
    assert len(probes) == 2 and all(e["max_tokens"] == 1 for e in probes)
    assert not {e["prompt"] for e in probes} & {e["prompt"] for e in streamed}
    assert len(streamed) == 2 + 4 + 4
    # the mock's truth: every prompt within 1% of --input-len
    assert all(within_1pct(100, e["prompt_tokens"]) for e in streamed), [e["prompt_tokens"] for e in streamed]
    # the overhead is real: BOS, the ChatML markers and the roles around the content
    tk = doc["run"]["tokenizer"]
    assert tk["template_tokens"] >= 5 and tk["probe_requests"] == 2 and tk["check_error_pct"] <= 1.0
    assert tk["path"].endswith("tokenizer.json") and len(tk["sha256"]) == 64
    assert "counted by --tokenizer plus" in stderr and "2 probe requests" in stderr
    assert "prompt lengths predicted within" in stderr
    # predicted before sending, compared with usage after
    ss = [s for s in samples(doc) if s.get("concurrency")]
    assert ss and all(s["prompt_source"] == "tokenizer" and s["prompt_tokens"] == 100 for s in ss)
    assert all(within_1pct(s["prompt_tokens"], s["usage"]["prompt_tokens"]) for s in ss)
    for lv in doc["levels"]:
        err = lv["prompt_token_error"]
        assert err["requests"] == 4 and err["mean_pct"] <= 1.0 and err["max_pct"] <= 1.0
        assert within_1pct(round(lv["prompt_tokens_mean"]), 100)  # the server's count
        assert "prompt_mismatch" not in codes(lv["advice"])
    assert not {"no_tokenizer", "prompt_mismatch"} & codes(doc["run"]["advice"])


def test_without_a_tokenizer_the_probe_path_is_unchanged_and_costs_more_requests(server: str) -> None:
    before = len(mock_log(server))
    doc, _ = serve_bench(server, *ARGS)
    log = mock_log(server)[before:]
    probes = [e for e in log if not e["stream"]]
    assert len(probes) > 2  # the probe prompt is fitted request by request
    assert {e["prompt_tokens"] for e in log if e["stream"]} == {100}  # fitted on the probe, exact here
    assert doc["run"]["tokenizer"] is None and "no_tokenizer" in codes(doc["run"]["advice"])
    assert all(lv["prompt_token_error"] is None for lv in doc["levels"])
    assert all(s["prompt_tokens"] is None and s["prompt_source"] is None for s in samples(doc) if s.get("concurrency"))


CONVERSATIONS = [
    (
        "What limits prompt processing on a mixture-of-experts model? Answer in one line.",
        "Bandwidth to wherever the experts are.",
    ),
    (
        "Explain, briefly: why does the time to the first token grow when requests queue?",
        "Because requests wait for a free slot before their prompt is processed at all.",
    ),
    (
        "Straße, café, naïve: how many tokens does a byte-level tokenizer make of these?",
        "Several each; the non-ASCII letters are two bytes or more.",
    ),
    (
        "Write a haiku about experts living in system memory.",
        "Weights rest far away / the router calls a few names / tokens flow like rain.",
    ),
    (
        "Summarize: caching the prefix of a prompt saves the work of processing it again, when the next "
        "request starts the same way, as an agent's requests do.",
        "Prefix caching skips repeated work.",
    ),
    (
        "def route(x):\n    return topk(softmax(W @ x), k=8)  # what does this do?",
        "It picks the eight experts with the highest router scores.",
    ),
    ("日本語のテキストはどう分割されますか？", "バイト単位です。"),
    (
        "Quantization: four bits per weight instead of sixteen. Is the loss of quality measurable?",
        "Yes: measure perplexity or task scores, do not guess.",
    ),
]


def test_dataset_prompts_and_replies_are_counted_before_sending(server: str, tok_dir: Path, tmp_path: Path) -> None:
    rows = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in CONVERSATIONS]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    tok = tok_dir / "tokenizer.json"
    before = len(mock_log(server))
    # no --output-len: each reply's length, counted by the tokenizer, sets the request's
    doc, _ = serve_bench(
        server, "--dataset", str(tmp_path / "sg.json"), "--requests", "8", "--warmup", "0", "--tokenizer", str(tok)
    )
    log = mock_log(server)[before:]
    assert len([e for e in log if not e["stream"]]) == 2
    truth = {e["id"]: e["prompt_tokens"] for e in log if e["stream"]}
    ss = samples(doc)
    assert len(ss) == 8 and len(truth) == 8
    for s in ss:
        assert s["prompt_source"] == "tokenizer"
        assert within_1pct(s["prompt_tokens"], truth[s["response_id"]])
    replies = {max(1, count(tok, a)) for _, a in CONVERSATIONS}
    assert {s["max_tokens"] for s in ss} <= replies and len({s["max_tokens"] for s in ss}) > 3
    (lv,) = doc["levels"]
    assert lv["prompt_token_error"]["requests"] == 8 and lv["prompt_token_error"]["mean_pct"] <= 1.0


def test_an_error_at_the_contents_edge_is_stated(tok_dir: Path, tmp_path: Path) -> None:
    """Template markers that are not special tokens merge with a message's last punctuation mark:
    the prediction is one token high for those prompts, and the run says by how much (a warning
    above 1%); prompts that end in a letter, as the synthetic ones do, are exact."""
    plain = tok_dir / "plain.json"
    rows = [{"conversations": [{"from": "human", "value": q}]} for q, _ in CONVERSATIONS]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    with vllm_mock(MockConfig(ttft_ms=5.0, pp_ms_per_token=0.0, itl_ms=1.0, tokenizer=str(plain))) as url:
        doc, _ = serve_bench(url, *ARGS, "--tokenizer", str(plain))
        ds, _ = serve_bench(
            url,
            "--dataset",
            str(tmp_path / "sg.json"),
            "--requests",
            "8",
            "--warmup",
            "0",
            "--output-len",
            "4",
            "--tokenizer",
            str(plain),
        )
        prompts = {e["id"]: e["prompt"] for e in mock_log(url)}
    assert all(s["prompt_tokens"] == s["usage"]["prompt_tokens"] == 100 for s in samples(doc) if s["concurrency"])
    assert all(lv["prompt_token_error"]["mismatched"] == 0 for lv in doc["levels"])
    ss = samples(ds)
    off = [s["prompt_tokens"] - s["usage"]["prompt_tokens"] for s in ss]
    # one token high where the message ends in a punctuation mark the BPE merges with "<|im_end|>"
    # (those of the training text: "." but not "?"), exact where it ends in a letter
    ends = [prompts[s["response_id"]].split("<|im_end|>")[0][-1] for s in ss]
    assert set(off) == {0, 1} and {(c, d) for c, d in zip(ends, off, strict=True) if c.isalnum() or c == "."} == {
        (c, int(c == ".")) for c in ends if c.isalnum() or c == "."
    }
    (lv,) = ds["levels"]
    err = lv["prompt_token_error"]
    errors = [100 * d / s["usage"]["prompt_tokens"] for d, s in zip(off, ss, strict=True)]
    assert err["mismatched"] == sum(off) and err["mean_pct"] == round(sum(errors) / len(errors), 3)
    assert err["max_pct"] == round(max(errors), 3)
    assert ("prompt_mismatch" in codes(lv["advice"])) is (err["mean_pct"] > 1.0)


def test_another_models_tokenizer_is_told_before_and_after(server: str, tok_dir: Path) -> None:
    doc, stderr = serve_bench(
        server,
        "--requests",
        "3",
        "--input-len",
        "100",
        "--output-len",
        "4",
        "--warmup",
        "0",
        "--tokenizer",
        str(tok_dir / "other.json"),
    )
    tk = doc["run"]["tokenizer"]
    assert tk["check_error_pct"] > 1.0
    (before,) = [a for a in doc["run"]["advice"] if a["code"] == "prompt_mismatch"]
    assert "not the served model's tokenizer" in before["message"] and "tokenizer.json" in before["remedy"]
    (lv,) = doc["levels"]
    assert lv["prompt_token_error"]["mean_pct"] > 1.0
    (after,) = [a for a in lv["advice"] if a["code"] == "prompt_mismatch"]
    assert f"off by {lv['prompt_token_error']['mean_pct']:.1f}%" in after["message"]
    assert "not the served model's tokenizer" in stderr or doc["run"]["warnings"]


def test_a_server_with_tokenize_counts_itself(tok_dir: Path) -> None:
    with mock_server.mock_server(mock_server.MockConfig(ttft_ms=(5.0,), itl_ms=(1.0,))) as url:
        doc, stderr = serve_bench(
            url,
            "--requests",
            "2",
            "--input-len",
            "40",
            "--output-len",
            "4",
            "--warmup",
            "0",
            "--tokenizer",
            str(tok_dir / "tokenizer.json"),
        )
    assert "is not used: the server counts prompts itself" in stderr
    assert doc["run"]["tokenizer"] is None and doc["levels"][0]["prompt_token_error"] is None
    assert all(s["prompt_source"] is None and s["prompt_tokens"] == 40 for s in samples(doc))


def test_agent_sessions_are_sized_by_the_tokenizer_without_probes(server: str, tok_dir: Path) -> None:
    before = len(mock_log(server))
    doc, stderr = serve_bench(
        server,
        "--sessions",
        "2",
        "--turns",
        "2",
        "--system-tokens",
        "40",
        "--turn-tokens",
        "20",
        "--output-len",
        "4",
        "--warmup",
        "0",
        "--tokenizer",
        str(tok_dir / "tokenizer.json"),
    )
    assert not [e for e in mock_log(server)[before:] if not e["stream"]]
    assert "lengths counted by --tokenizer" in stderr
    assert doc["run"]["tokenizer"]["path"].endswith("tokenizer.json")
    assert "no_tokenizer" not in codes(doc["run"]["advice"])


# -- what cannot be used: one line, exit 2, before any server is asked ---------------------------

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a bad --tokenizer must be told before connecting


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "No such file"),
        ("dir", "not a file"),
        (b"merges: no\n", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b'{"version": "1.0"}', "not a tokenizer"),
        (b'{"model": {"type": "Nonsense"}}', "not a tokenizer the `tokenizers` package reads"),
        (b"GGUF\x03\x00\x00\x00", "a GGUF file"),
    ],
)
def test_a_tokenizer_that_does_not_load(tmp_path: Path, content: bytes | str | None, says: str) -> None:
    path = tmp_path / "tok.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    r = run_cli("serve-bench", NOWHERE, "--tokenizer", str(path))
    assert r.exit_code == 2, r.stderr
    assert f"--tokenizer {path}" in r.stderr and says in r.stderr
    assert "Traceback" not in r.stderr


def test_without_the_tokenizers_package(tok_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tokenizers" else real(name, *a))
    r = run_cli("serve-bench", NOWHERE, "--tokenizer", str(tok_dir / "tokenizer.json"))
    assert r.exit_code == 2
    assert "needs the Python package `tokenizers`" in r.stderr and "pip install 'moetune[tokenizers]'" in r.stderr


def test_replay_sends_requests_as_recorded(tok_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text("")
    r = run_cli(
        "serve-bench", NOWHERE, "--replay", str(tmp_path / "s.jsonl"), "--tokenizer", str(tok_dir / "tokenizer.json")
    )
    assert r.exit_code == 2 and "--tokenizer" in r.stderr


# -- the figures, from samples (pure) ------------------------------------------------------------


def _sample(i: int, predicted: int | None, served: int, source: str | None = "tokenizer") -> dict[str, Any]:
    return {
        "index": i,
        "concurrency": 1,
        "rate": None,
        "t_sched": float(i),
        "t_slot": float(i),
        "t_send": float(i),
        "t_end": i + 0.5,
        "chunks": [[i + 0.1, 1, 1, 0], [i + 0.2, 1, 1, 0]],
        "prompt_tokens": predicted,
        "prompt_source": source,
        "usage": {"prompt_tokens": served, "completion_tokens": 2},
        "max_tokens": 2,
    }


@pytest.mark.parametrize(
    ("pairs", "mean", "worst", "warned"),
    [
        ([(100, 100), (100, 100)], 0.0, 0.0, False),
        ([(100, 101), (100, 100), (100, 99)], 0.667, 1.01, False),
        ([(100, 110), (100, 100)], 4.545, 9.091, True),
    ],
)
def test_prompt_token_error(pairs: list[tuple[int, int]], mean: float, worst: float, warned: bool) -> None:
    lv = summarize_level([_sample(i, p, s) for i, (p, s) in enumerate(pairs)])
    e = lv["prompt_token_error"]
    assert (e["requests"], e["mean_pct"], e["max_pct"]) == (len(pairs), mean, worst)
    assert lv["prompt_tokens_mean"] == pytest.approx(sum(s for _, s in pairs) / len(pairs))  # the server's count
    annotate([lv], slots=None, prefix_cache=False)
    assert ("prompt_mismatch" in codes(lv["advice"])) is warned


def test_a_mismatch_counted_by_the_server_itself_is_still_warned() -> None:
    lv = summarize_level([_sample(0, 100, 101, source=None)])
    assert lv["prompt_token_error"] is None and lv["prompt_token_mismatches"] == 1
    assert lv["prompt_tokens_mean"] == 100  # what /tokenize counted, as before
    annotate([lv], slots=None, prefix_cache=False)
    (w,) = [a for a in lv["advice"] if a["code"] == "prompt_mismatch"]
    assert "/tokenize" in w["message"]
