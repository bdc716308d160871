"""serve-bench --tokenizer against a real llama-server whose /tokenize, /apply-template and /props
are hidden by a proxy (as vLLM has none of them): the model's own chat template and tokenizer
count, and a tokenizer.json written from the GGUF's vocabulary predicts."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench import servers
from tests.bench.hiding_proxy import hiding_proxy
from tests.bench.test_serve_tokenizer import CONVERSATIONS, samples, serve_bench, within_1pct
from tests.helpers import llama_server

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        importlib.util.find_spec("tokenizers") is None,
        reason="needs the tokenizers package: pip install 'moetune[tokenizers]'",
    ),
]


def gguf_tokenizer_json(gguf: Path, out: Path) -> Path:
    """The tokenizer.json of a generated model's byte-level SentencePiece vocabulary, as Hugging Face
    writes one for a Llama tokenizer: spaces to "▁" with one in front, bytes for every character
    the vocabulary lacks (all of them here), a BOS in front."""
    from gguf import GGUFReader

    f = GGUFReader(str(gguf)).fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    bos = {"SpecialToken": {"id": tokens[1], "type_id": 0}}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "pre_tokenizer": None,
        "decoder": None,
        "added_tokens": [
            {
                "id": i,
                "content": tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in range(3)
        ],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            ],
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tokens[1]: {"id": tokens[1], "ids": [1], "tokens": [tokens[1]]}},
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[0],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [],
        },
    }
    out.write_text(json.dumps(doc))
    return out


@pytest.fixture(scope="module")
def model(models: Path) -> Path:
    return servers.model(models, "serve-qwen3moe", n_layer=2)


@pytest.fixture(scope="module")
def hidden(bin_dir: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("hidden") / "server.log"
    with llama_server(bin_dir, model, log, "-nr", "--parallel", "2", "-c", "8192") as s, hiding_proxy(s.url) as url:
        yield url


def probes(stderr: str) -> int:
    m = re.search(r"\((\d+) probe requests", stderr)
    assert m, stderr
    return int(m.group(1))


def test_llama_servers_own_counts_are_predicted(hidden: str, model: Path, tmp_path: Path) -> None:
    tok = gguf_tokenizer_json(model, tmp_path / "tokenizer.json")
    args = ("-C", "1,2", "--requests", "4", "--input-len", "128", "--output-len", "8")
    doc, stderr = serve_bench(hidden, *args, "--tokenizer", str(tok))
    assert doc["run"]["server"]["caps"]["tokenize"] is False  # the proxy hid it
    assert doc["run"]["tokenizer"]["template_tokens"] > 0 and probes(stderr) == 2
    ss: list[dict[str, Any]] = [s for s in samples(doc) if s["concurrency"]]
    assert all(s["prompt_tokens"] == 128 and within_1pct(128, s["usage"]["prompt_tokens"]) for s in ss)
    assert all(lv["prompt_token_error"]["mean_pct"] <= 1.0 for lv in doc["levels"])
    _, without = serve_bench(hidden, *args)
    assert probes(without) > 2

    rows = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in CONVERSATIONS]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    ds, _ = serve_bench(
        hidden, "--dataset", str(tmp_path / "sg.json"), "--requests", "8", "--warmup", "0", "--tokenizer", str(tok)
    )
    ss = samples(ds)
    assert len(ss) == 8 and all(within_1pct(s["prompt_tokens"], s["usage"]["prompt_tokens"]) for s in ss)


def test_without_a_tokenizer_the_probe_stays_within_a_small_context(bin_dir: Path, model: Path, tmp_path: Path) -> None:
    """A byte-level vocabulary makes a word five or six tokens: the probe that fits the prompt
    length must not send many times --input-len (it once sent ~4800 tokens to a 2048-token slot)."""
    with (
        llama_server(bin_dir, model, tmp_path / "s.log", "-nr", "--parallel", "1", "-c", "2048") as s,
        hiding_proxy(s.url) as url,
    ):
        doc, _ = serve_bench(url, "-C", "1", "--requests", "2", "--input-len", "256", "--output-len", "8")
    lv = doc["levels"][0]
    assert lv["ok"] == 2 and abs(lv["prompt_tokens_mean"] - 256) <= 3
