"""``--hf OWNER/REPO[:QUANT]`` against a Hugging Face-style hub on the loopback (HF_ENDPOINT): the
repository listing picks the model, files resolve (through a CDN redirect, as huggingface.co does),
and HF_TOKEN goes to the hub only, never to the CDN and never into the output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.model.hf import choose, parse_spec
from moetune.model.profile import load_profile
from tests.gguf_http import Hub, serve
from tests.helpers import run_cli
from tests.model.conftest import REPO, glm_shard

TOKEN = "hf_SECRETtoken123"
GLM_FIRST = "IQ3_KS/GLM-5.1-IQ3_KS-00001-of-00008.gguf"

FILES = [
    "README.md",
    ".gitattributes",
    "mmproj-F16.gguf",
    "tiny-Q8_0.gguf",
    "tiny-Q4_K_M.gguf",
    *(f"IQ3_KS/GLM-IQ3_KS-{i:05d}-of-00003.gguf" for i in (1, 2, 3)),
    *(f"UD-Q2_K_XL/GLM-UD-Q2_K_XL-{i:05d}-of-00002.gguf" for i in (2, 1)),
]


@pytest.mark.parametrize(
    ("sel", "path"),
    [
        ("IQ3_KS", "IQ3_KS/GLM-IQ3_KS-00001-of-00003.gguf"),  # a directory
        ("IQ3_KS/", "IQ3_KS/GLM-IQ3_KS-00001-of-00003.gguf"),
        ("UD-Q2_K_XL", "UD-Q2_K_XL/GLM-UD-Q2_K_XL-00001-of-00002.gguf"),
        ("IQ3_KS/GLM-IQ3_KS-00002-of-00003.gguf", "IQ3_KS/GLM-IQ3_KS-00001-of-00003.gguf"),  # a shard: its model
        ("tiny-Q8_0.gguf", "tiny-Q8_0.gguf"),  # a file
        ("Q8_0", "tiny-Q8_0.gguf"),  # a quant tag, as llama.cpp's -hf takes it
        ("q4_k_m", "tiny-Q4_K_M.gguf"),
    ],
)
def test_choose(sel: str, path: str) -> None:
    repo, s = parse_spec(f"o/r:{sel}")
    c = choose(repo, FILES, s)
    assert c.path == path


def test_choose_lists_the_models_when_it_cannot() -> None:
    with pytest.raises(InputError) as e:
        choose("o/r", FILES, None)
    assert "4 models match" in str(e.value)
    assert "IQ3_KS/GLM-IQ3_KS-00001-of-00003.gguf (3 shards)" in e.value.details
    assert not any("mmproj" in d for d in e.value.details)
    with pytest.raises(InputError) as e:
        choose("o/r", FILES, "Q4_K")  # a tag matches whole: not Q4_K_M
    assert "nothing matches 'Q4_K'" in str(e.value) and len(e.value.details) == 4
    with pytest.raises(InputError, match="no GGUF file"):
        choose("o/r", ["README.md"], None)
    assert choose("o/r", ["a/m-00001-of-00002.gguf", "a/m-00002-of-00002.gguf"], None).include == "a/m-*-of-00002.gguf"


@pytest.mark.parametrize("spec", ["noslash", "/r", "o/r/x", "o/r:", ""])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(InputError, match="OWNER/REPO"):
        parse_spec(spec)


@pytest.fixture
def hf(hub_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Hub, Hub]]:
    """The hub at HF_ENDPOINT, redirecting file downloads to a CDN on another port; HF_TOKEN set."""
    with serve(Hub(hub_root)) as cdn, serve(Hub(hub_root, repos={REPO: hub_root / REPO}, cdn=cdn)) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url + "/")
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield hub, cdn


def test_hf_inspect_reads_the_quant_through_the_cdn_with_the_token_at_the_hub_only(
    hf: tuple[Hub, Hub], hub_root: Path
) -> None:
    hub, cdn = hf
    r = run_cli("inspect", "--hf", f"{REPO}:IQ3_KS", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    local = load_profile(glm_shard(hub_root, 1))
    assert doc["n_tensors"] == len(local.tensors) and doc["total_bytes"] == local.total_bytes
    assert doc["files"][0] == f"{hub.url}/{REPO}/resolve/main/{GLM_FIRST}"
    assert doc["local_path"] == GLM_FIRST
    assert doc["download"] == f"hf download {REPO} --include 'IQ3_KS/GLM-5.1-IQ3_KS-*-of-00008.gguf' --local-dir ."
    assert doc["bytes_fetched"] < glm_shard(hub_root, 1).stat().st_size / 100
    assert hub.log[0].path == f"/api/models/{REPO}"
    assert len(hub.log) == 9  # the listing, then each shard's first request (redirected)
    assert all(e.authorization == f"Bearer {TOKEN}" for e in hub.log)
    assert cdn.log and all(e.authorization is None for e in cdn.log)  # the token stays at the hub
    assert TOKEN not in r.stdout + r.stderr
    human = run_cli("inspect", "--hf", f"{REPO}:IQ3_KS")
    assert human.exit_code == 0 and TOKEN not in human.stdout + human.stderr


def test_hf_plan_says_where_the_download_puts_the_model(hf: tuple[Hub, Hub], hub_root: Path) -> None:
    r = run_cli(
        "plan", "--hf", f"{REPO}:IQ3_KS", "--hw", "rtx-pro-6000", "--strategy", "n-cpu-moe:64", "--format", "argv"
    )
    assert r.exit_code == 0, r.stderr
    assert f"-m {GLM_FIRST} " in r.stdout and "http" not in r.stdout
    assert f"hf download {REPO} --include" in r.stderr
    assert TOKEN not in r.stdout + r.stderr
    j = run_cli("plan", "--hf", f"{REPO}:IQ3_KS", "--hw", "rtx-pro-6000", "--strategy", "n-cpu-moe:64", "--json")
    local = json.loads(
        run_cli(
            "plan", str(glm_shard(hub_root, 1)), "--hw", "rtx-pro-6000", "--strategy", "n-cpu-moe:64", "--json"
        ).stdout
    )
    doc = json.loads(j.stdout)
    assert (doc["fits"], doc["devices"], doc["predicted"]) == (local["fits"], local["devices"], local["predicted"])
    assert doc["services"][0]["model_given"] == f"--hf {REPO}:IQ3_KS"


@pytest.mark.usefixtures("hf")
def test_hf_quant_tag_and_errors() -> None:
    r = run_cli("inspect", "--hf", f"{REPO}:Q8_0", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["local_path"] == "tiny-Q8_0.gguf"
    for args, code, says in [
        (["inspect", "--hf", REPO], 2, "2 models match"),
        (["inspect", "--hf", f"{REPO}:IQ2_XXS"], 2, "nothing matches 'IQ2_XXS'"),
        (["inspect", "--hf", "owner/nothing-here"], 2, "no such repository"),
        (["inspect", "x.gguf", "--hf", REPO], 2, "not both"),
        (["plan", "--hf", "owner", "--hw", "rtx-pro-6000"], 2, "OWNER/REPO"),
    ]:
        r = run_cli(*args)
        assert r.exit_code == code, (args, r.stderr)
        assert says in r.stderr and TOKEN not in r.stderr, (args, r.stderr)


def test_the_token_goes_to_the_hf_endpoint_only(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_ENDPOINT", raising=False)  # huggingface.co: not this server
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    r = run_cli("inspect", hub.file_url("vocab.gguf"), "--json")
    assert r.exit_code == 0, r.stderr
    assert hub.log and all(e.authorization is None for e in hub.log)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    r = run_cli("inspect", hub.file_url("vocab.gguf"), "--json")  # a URL on the endpoint gets it
    assert r.exit_code == 0 and hub.log[-1].authorization == f"Bearer {TOKEN}"
    assert TOKEN not in r.stdout + r.stderr
