"""Plan before download: GGUF headers read over HTTP Range requests from a loopback server give the
same profile, inspect document and plan as the local files, fetch a sliver of the model, and every
way a server can fail is one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moetune.errors import InputError, RuntimeFailure
from moetune.model.gguf_read import read_gguf
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.remote import Client, HttpSource, curl_command, shard_urls
from tests.gguf_http import Hub
from tests.helpers import run_cli
from tests.model.conftest import GLM_DIR, glm_shard

REMOTE_KEYS = ("bytes_fetched", "requests", "download", "local_path")


def same_model(remote: ModelProfile, local: ModelProfile) -> None:
    assert remote.arch == local.arch
    assert remote.metadata == local.metadata
    assert remote.tensors == local.tensors  # names, types, shapes, sizes, file_index, offsets


def test_glm_profile_over_http_equals_local_and_fetches_a_sliver(hub: Hub, hub_root: Path) -> None:
    url = hub.file_url(glm_shard(hub_root, 4).relative_to(hub_root))
    remote = load_profile(url)
    local = load_profile(glm_shard(hub_root, 4))
    same_model(remote, local)
    assert remote.files == tuple(hub.file_url(glm_shard(hub_root, i).relative_to(hub_root)) for i in range(1, 9))
    assert remote.remote is not None
    one_shard = glm_shard(hub_root, 1).stat().st_size
    assert remote.remote.bytes_fetched < one_shard / 100  # acceptance: < 1% of ONE shard, in all
    assert remote.remote.bytes_fetched == hub.bytes_sent
    assert remote.remote.requests == len(hub.log) <= 16
    assert all(entry.range is not None for entry in hub.log)
    assert remote.remote.local_path == "GLM-5.1-IQ3_KS-00001-of-00008.gguf"
    assert remote.remote.download == (
        f"curl -L --remote-name-all '{hub.url}/files/{GLM_DIR}/GLM-5.1-IQ3_KS-[00001-00008]-of-00008.gguf'"
    )


@pytest.mark.parametrize("first_chunk", [24, 100, 4096])
def test_small_chunks_grow_through_the_vocabulary(hub: Hub, hub_root: Path, first_chunk: int) -> None:
    """The string-array loop resumes where the fetched bytes end, whatever the chunk size."""
    src = HttpSource(Client(), hub.file_url("vocab.gguf"), first_chunk=first_chunk)
    from moetune.model.gguf_read import parse

    remote, local = parse(src), read_gguf(hub_root / "vocab.gguf")
    assert (remote.metadata, remote.tensors, remote.data_offset) == (local.metadata, local.tensors, local.data_offset)
    assert len(src.buf) < 2 * local.header_bytes + first_chunk


def _without(doc: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in keys}


def test_inspect_url_prints_the_local_document_plus_what_it_fetched(hub: Hub, hub_root: Path) -> None:
    url = hub.file_url(glm_shard(hub_root, 2).relative_to(hub_root))
    r = run_cli("inspect", url, "--json")
    assert r.exit_code == 0, r.stderr
    remote = json.loads(r.stdout)
    local = json.loads(run_cli("inspect", str(glm_shard(hub_root, 2)), "--json").stdout)
    assert _without(remote, "files", *REMOTE_KEYS) == _without(local, "files")
    assert remote["files"][0] == hub.file_url(glm_shard(hub_root, 1).relative_to(hub_root))
    assert 0 < remote["bytes_fetched"] < glm_shard(hub_root, 1).stat().st_size / 100
    human = run_cli("inspect", url)
    assert human.exit_code == 0, human.stderr
    assert "(8 files)" in human.stdout
    assert "fetched " in human.stdout and " KiB in " in human.stdout and " requests" in human.stdout


PLAN = (
    "--hw",
    "rtx-pro-6000",
    "--strategy",
    "n-cpu-moe:64",
    "--ctx",
    "32768",
    "--ctk",
    "q8_0",
    "--ctv",
    "q8_0",
    "--json",
)


def test_plan_url_gives_the_local_plan_with_a_note_to_download(hub: Hub, hub_root: Path) -> None:
    url = hub.file_url(glm_shard(hub_root, 1).relative_to(hub_root))
    r = run_cli("plan", url, *PLAN)
    assert r.exit_code == 0, r.stderr
    remote = json.loads(r.stdout)
    local = json.loads(run_cli("plan", str(glm_shard(hub_root, 1)), *PLAN).stdout)
    for key in ("fits", "devices", "shortfalls", "predicted"):
        assert remote[key] == local[key], key
    sj, lj = remote["services"][0], local["services"][0]
    assert sj["layers"] == lj["layers"] and sj["override_rules"] == lj["override_rules"]
    m = sj["argv"].index("-m")
    assert sj["argv"][m + 1] == "GLM-5.1-IQ3_KS-00001-of-00008.gguf"  # not a URL: llama-server cannot open one
    assert sj["argv"][:m] + sj["argv"][m + 2 :] == lj["argv"][:m] + lj["argv"][m + 2 :]
    assert sj["model"] == url and sj["model_given"] == url
    assert sj["remote"]["bytes_fetched"] > 0 and len(sj["remote"]["files"]) == 8
    notes = [w for w in remote["warnings"] if "remote" in w["message"]]
    assert len(notes) == 1 and "curl -L --remote-name-all" in notes[0]["remedy"]
    assert "fetched" in r.stderr
    text = run_cli("plan", url, *PLAN[:-1], "--format", "argv")
    assert text.exit_code == 0, text.stderr
    assert "-m GLM-5.1-IQ3_KS-00001-of-00008.gguf " in text.stdout and "http" not in text.stdout
    assert "the model is remote" in text.stderr and "download it first" in text.stderr


def test_plan_url_as_a_container_says_to_download_first(hub: Hub, hub_root: Path) -> None:
    url = hub.file_url(glm_shard(hub_root, 1).relative_to(hub_root))
    r = run_cli("plan", url, "--hw", "rtx-pro-6000", "--format", "podman")
    assert r.exit_code == 2 and "download the model" in r.stderr


def test_a_loopback_url_never_goes_through_a_proxy(hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: nothing answers there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert load_profile(hub.file_url("vocab.gguf")).arch == "qwen3moe"


def test_a_server_without_ranges_is_read_up_to_the_header_only(hub: Hub, hub_root: Path) -> None:
    hub.ranges = False
    url = hub.file_url(glm_shard(hub_root, 3).relative_to(hub_root))
    r = run_cli("inspect", url, "--json")
    assert r.exit_code == 0, r.stderr
    assert "ignores Range requests" in r.stderr and "(and 7 more files)" in r.stderr
    doc = json.loads(r.stdout)
    one_shard = glm_shard(hub_root, 1).stat().st_size
    assert doc["bytes_fetched"] < one_shard / 100
    assert hub.bytes_sent < one_shard / 100  # the server was stopped, not drained: socket buffers at most
    local = json.loads(run_cli("inspect", str(glm_shard(hub_root, 3)), "--json").stdout)
    assert _without(doc, "files", *REMOTE_KEYS) == _without(local, "files")


def _fails(args: list[str], code: int, *says: str) -> str:
    r = run_cli(*args)
    assert r.exit_code == code, (r.exit_code, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error:"), r.stderr
    for s in says:
        assert s in r.stderr, r.stderr
    return r.stderr


def test_not_found(hub: Hub) -> None:
    _fails(["inspect", hub.file_url("nope.gguf")], 2, "nope.gguf: not found (HTTP 404)")
    _fails(["plan", hub.file_url("nope.gguf"), "--hw", "rtx-pro-6000"], 2, "not found (HTTP 404)")


def test_missing_shard(hub: Hub) -> None:
    _fails(["inspect", hub.file_url("split/m-00001-of-00003.gguf")], 2, "missing shard m-00003-of-00003.gguf of 3")


def test_redirects_are_followed_up_to_a_cap(hub: Hub) -> None:
    ok = run_cli("inspect", f"{hub.url}/hops/3/vocab.gguf", "--json")
    assert ok.exit_code == 0, ok.stderr
    _fails(["inspect", f"{hub.url}/hops/11/vocab.gguf"], 1, "more than 10 redirects")


def test_redirect_loop(hub: Hub) -> None:
    _fails(["inspect", f"{hub.url}/loop/vocab.gguf"], 1, "redirect loop", "/loop2/vocab.gguf → ")


def test_timeout(hub: Hub) -> None:
    hub.delay_s = 2.0
    _fails(
        ["inspect", hub.file_url("vocab.gguf"), "--http-timeout", "0.3"], 1, "no answer within 0.3 s", "--http-timeout"
    )


def test_nothing_listening() -> None:
    from tests.engine_harness import free_port

    _fails(["inspect", f"http://127.0.0.1:{free_port()}/m.gguf"], 1, "cannot reach the server")


@pytest.mark.parametrize("end", [10, 300, 30_000])
def test_file_ends_inside_its_header(hub: Hub, end: int) -> None:
    hub.truncate_to = end  # 10: shorter than any header; 300: in the metadata; 30 000: in the vocabulary
    _fails(["inspect", hub.file_url("vocab.gguf")], 2, "truncated")


def test_empty_file(hub: Hub) -> None:
    _fails(["inspect", hub.file_url("empty.gguf")], 2, "truncated (0 bytes")


def test_not_a_gguf_file(hub: Hub) -> None:
    _fails(["inspect", hub.file_url("notes.txt")], 2, "not a GGUF file")


def test_errors_are_moetune_errors_in_the_library_too(hub: Hub) -> None:
    with pytest.raises(InputError):
        load_profile(hub.file_url("nope.gguf"))
    with pytest.raises(RuntimeFailure):
        load_profile(f"{hub.url}/loop/x.gguf")


def test_shard_urls_and_download_command() -> None:
    urls = shard_urls("https://h.example/a%20b/M-Q4-00002-of-00003.gguf?download=true")
    assert urls == [
        "https://h.example/a%20b/M-Q4-00001-of-00003.gguf?download=true",
        "https://h.example/a%20b/M-Q4-00002-of-00003.gguf?download=true",
        "https://h.example/a%20b/M-Q4-00003-of-00003.gguf?download=true",
    ]
    assert shard_urls("https://h.example/m.gguf") == ["https://h.example/m.gguf"]
    assert curl_command(urls) == "curl -L --remote-name-all 'https://h.example/a%20b/M-Q4-[00001-00003]-of-00003.gguf'"
    assert curl_command(["https://h.example/m.gguf?x=1"]) == "curl -L -O 'https://h.example/m.gguf'"


def test_a_layout_service_may_name_a_url(hub: Hub, hub_root: Path, tmp_path: Path) -> None:
    url = hub.file_url(glm_shard(hub_root, 1).relative_to(hub_root))
    layout = tmp_path / "layout.yaml"
    layout.write_text(f"services:\n  - {{name: grandpa, model: '{url}', strategy: n-cpu-moe:64}}\n")
    r = run_cli("plan", "--layout", str(layout), "--hw", "rtx-pro-6000", "--json")
    assert r.exit_code == 0, r.stderr
    sj = json.loads(r.stdout)["services"][0]
    assert sj["model"] == url and sj["remote"]["local_path"] == "GLM-5.1-IQ3_KS-00001-of-00008.gguf"
