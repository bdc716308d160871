"""A plan that listens on purpose (loopback, or every interface: then reached through 127.0.0.1
only) with an API key: the real llama-server requires the key, moetune's own clients send it (the
health wait, bench, serve-bench, the sampler), and the key is written nowhere (plan, run
directory, logs, history)."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from moetune.engine import auth
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


def _bound(port: int) -> set[str]:
    """The addresses (as /proc/net/tcp spells them) something listens on at ``port``."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return {r[1].split(":")[0] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port}


@pytest.mark.server
@pytest.mark.parametrize(("host", "bound"), [("127.0.0.1", "0100007F"), ("0.0.0.0", "00000000")])
def test_key_required_sent_by_moetune_and_stored_nowhere(
    bin_dir: Path,
    tiny_model: Path,
    tmp_path: Path,
    moetune_home: Path,
    host: str,
    bound: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = f"sk-moetune-{secrets.token_hex(8)}"
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"# the project's key\n{key}\n")
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    port = free_port()
    plan = tmp_path / "plan.json"
    r = run_cli(
        "plan",
        str(tiny_model),
        "--hw",
        str(hw),
        "--ctx",
        "512",
        "--listen",
        f"{host}:{port}",
        "--api-key-file",
        str(key_file),
        "--engine-arg=--alias",
        "--engine-arg=tiny-alias",
        "--engine-arg=--no-warmup",
        "-o",
        str(plan),
    )
    assert r.exit_code == 0, r.stderr
    assert ("reachable from the network" in r.stderr) == (host != "127.0.0.1")
    spec, doc = read_plan(plan)
    with launched(spec, doc) as ln:
        assert _bound(port) == {bound}  # the server listens where the plan says
        assert ln.url == f"http://127.0.0.1:{port}"  # moetune's clients: loopback, on every interface too
        assert _get(ln.url + "/v1/chat/completions", None)[0] == 401  # not without the key
        status, body = _get(ln.url + "/v1/models", key)
        assert status == 200 and "tiny-alias" in body
        if host == "127.0.0.1":  # a client that moetune did not give the key: told how to, then $MOETUNE_API_KEY
            bench = ("bench", ln.url, "-r", "1", "--warmup", "0", "--max-tokens", "4", "--json")
            monkeypatch.setattr(auth, "_keys", {})
            r = run_cli(*bench)
            assert r.exit_code != 0 and "HTTP 401" in r.stderr and auth.KEY_ENV in r.stderr, r.stderr
            monkeypatch.setenv(auth.KEY_ENV, key)
            assert run_cli(*bench).exit_code == 0  # and kept set: the launches below record no key from it
    r = run_cli("bench", str(plan), "-r", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)  # measured through the key
    r = run_cli(
        "serve-bench", str(plan), "--json", "--requests", "2", "--input-len", "64", "--output-len", "4", "--warmup", "0"
    )
    assert r.exit_code == 0, r.stderr
    levels = json.loads(r.stdout)["levels"]
    assert [lv["ok"] for lv in levels] == [2], levels  # every request through the key
    written = [f for f in [plan, *moetune_home.rglob("*")] if f.is_file()]
    names = {f.name for f in written}
    assert {"results.sqlite", "main.log", "plan.json", "run.json"} <= names, names  # the history, the run dirs
    for f in written:
        assert key.encode() not in f.read_bytes(), f"the key is written in {f}"
