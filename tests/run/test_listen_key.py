"""A plan that listens on purpose with an API key: the real llama-server requires the key,
moetune's own clients send it (the health wait, the bench, the sampler), and the key is written
nowhere (plan, run directory, logs, history)."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from moetune.run.launch import launched
from moetune.run.prepare import read_plan
from tests.helpers import free_port, run_cli


def _get(url: str, key: str | None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.server
def test_key_required_sent_by_moetune_and_stored_nowhere(bin_dir: Path, tiny_model: Path, tmp_path: Path,
                                                         moetune_home: Path) -> None:
    key = f"sk-moetune-{secrets.token_hex(8)}"
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"# the project's key\n{key}\n")
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]}))
    port = free_port()
    plan = tmp_path / "plan.json"
    r = run_cli("plan", str(tiny_model), "--hw", str(hw), "--ctx", "512", "--listen", f"127.0.0.1:{port}",
                "--api-key-file", str(key_file), "--alias", "tiny-alias", "--engine-arg=--no-warmup", "-o", str(plan))
    assert r.exit_code == 0, r.stderr
    spec, doc = read_plan(plan)
    with launched(spec, doc) as ln:
        assert ln.url == f"http://127.0.0.1:{port}"
        assert _get(ln.url + "/v1/chat/completions", None)[0] == 401  # not without the key
        status, body = _get(ln.url + "/v1/models", key)
        assert status == 200 and "tiny-alias" in body
    r = run_cli("bench", str(plan), "-r", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)  # measured through the key
    for f in [plan, *moetune_home.rglob("*")]:
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f"the key is written in {f}"
