"""The server's own options and the user's extra flags: rendered in the engine's spelling, refused
when moetune sets the flag from the plan or the build does not take it (pure, and through the CLI)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from moetune.app.plan_options import parse_listen
from moetune.engine.dialect import dialect
from moetune.engine.facts import KNOWN
from moetune.engine.server_args import (
    MANAGED,
    check_extra,
    flag_words,
    lift_extra,
    parse_sampling,
    server_options,
)
from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.plan.settings import ServerOptions, Settings
from tests.helpers import run_cli

MAIN = dialect(EngineKind.MAINLINE)
IK = dialect(EngineKind.IK)
# a build whose help is known: only these flags exist
CHECKED = replace(
    MAIN,
    flags=frozenset(
        {"--no-warmup", "--alias", "-tb", "--reasoning-budget", "--temp", "--top-k", "--seed", "--api-key-file"}
    ),
)


@pytest.mark.parametrize(
    ("settings", "d", "want"),
    [
        (Settings(threads_batch=24), MAIN, ["-tb", "24"]),
        (
            Settings(server=ServerOptions(alias="GLM-5.1", warmup_batch=True)),
            IK,
            ["--warmup-batch", "--alias", "GLM-5.1"],
        ),
        (Settings(merge_qkv=True, grouped_experts=True, engine=EngineKind.IK), IK, ["--merge-qkv", "-ger"]),
        (Settings(server=ServerOptions(thinking=False)), MAIN, ["--reasoning-budget", "0"]),
        (Settings(server=ServerOptions(thinking=True)), MAIN, ["--reasoning-budget", "-1"]),
        # a build without --reasoning-budget: the template's switch instead
        (
            Settings(server=ServerOptions(thinking=False)),
            replace(MAIN, flags=frozenset({"--chat-template-kwargs"})),
            ["--chat-template-kwargs", '{"enable_thinking": false}'],
        ),
        (
            Settings(server=ServerOptions(sampling=parse_sampling("temp=0.7,top_k=45,top_p=0.95,min_p=0.01"))),
            MAIN,
            ["--temp", "0.7", "--top-k", "45", "--top-p", "0.95", "--min-p", "0.01"],
        ),
        (
            Settings(server=ServerOptions(api_key_file="/k", extra_args=("--seed", "-1", "--no-warmup"))),
            CHECKED,
            ["--api-key-file", "/k", "--seed", "-1", "--no-warmup"],
        ),
    ],
)
def test_options_render_in_the_engines_spelling(settings: Settings, d: object, want: list[str]) -> None:
    assert server_options(settings, d) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "d", "match"),
    [
        (("-ngl", "10"), MAIN, "use --strategy"),
        (("--override-tensor=x=CPU",), MAIN, "use --strategy"),
        (("-c", "8192"), MAIN, "use --ctx"),
        (("--port", "9"), MAIN, "--listen"),
        (("--api-key", "sk-1"), MAIN, "--api-key-file"),
        (("-ub", "64"), MAIN, "-ub/--ubatch"),
        (("--cache-type-k", "q4_0"), MAIN, "--ctk"),
        (("--temp", "0.1"), MAIN, "--sampling"),
        (("--bogus",), CHECKED, "does not take --bogus"),
        (("--swa-full",), MAIN, "moetune does not model"),
        (("-nkvo",), MAIN, "moetune does not model"),
        (("-md", "/d.gguf"), MAIN, "moetune does not model"),
        (("GLM-5.1",), MAIN, "start with a flag"),
    ],
)
def test_extra_flags_that_are_refused(args: tuple[str, ...], d: object, match: str) -> None:
    with pytest.raises(InputError, match=match):
        check_extra(args, "e", d)  # type: ignore[arg-type]


def test_an_unknown_help_checks_nothing_but_managed_flags() -> None:
    check_extra(("--anything", "1"), "image", MAIN)  # the build's help is not known here
    assert not MAIN.flags and not dialect(EngineKind.IK, KNOWN[EngineKind.IK]).flags


def test_every_ledger_flag_is_managed() -> None:
    for f in (
        "-m",
        "-c",
        "-ot",
        "-ngl",
        "-ts",
        "--rpc",
        "--port",
        "-ub",
        "-b",
        "-ctk",
        "-ctv",
        "--parallel",
        "-fa",
        "--n-cpu-moe",
        "--cpu-moe",
        "-sm",
        "--host",
        "-dev",
        "-amb",
        "-mla",
        "--api-key",
    ):
        assert f in MANAGED


def test_extra_flags_a_plan_option_says_are_taken_as_it() -> None:
    s = lift_extra(
        Settings(
            server=ServerOptions(
                extra_args=(
                    "--merge-qkv",
                    "--alias",
                    "GLM-5.1",
                    "--no-warmup",
                    "-t",
                    "15",
                    "--threads-batch=24",
                    "-muge",
                    "--temp",
                    "0.7",
                    "--reasoning-budget",
                    "0",
                    "--seed",
                    "7",
                    "--warmup-batch",
                )
            )
        )
    )
    assert (s.merge_qkv, s.merge_up_gate, s.threads, s.threads_batch) == (True, True, 15, 24)
    assert (s.server.alias, s.server.thinking, s.server.warmup_batch) == ("GLM-5.1", False, True)
    assert s.server.sampling == (("temp", 0.7),) and s.server.extra_args == ("--no-warmup", "--seed", "7")
    assert lift_extra(s) == s  # once is enough


@pytest.mark.parametrize(
    ("settings", "args", "match"),
    [
        (Settings(threads=8), ("-t", "15"), "already says -t/--threads 8"),
        (Settings(server=ServerOptions(alias="a")), ("--alias=b",), "already says --alias a"),
        (
            Settings(server=ServerOptions(sampling=(("temp", 0.5),))),
            ("--temp", "0.7"),
            "already says --sampling temp=0.5",
        ),
        (Settings(), ("-t", "many"), "expected a whole number"),
        (Settings(), ("--alias",), "expected a value"),
        (Settings(), ("--alias", "--no-warmup"), "expected a value"),
        (Settings(), ("--reasoning-budget", "100"), "--thinking"),
    ],
)
def test_lifted_flags_that_are_refused(settings: Settings, args: tuple[str, ...], match: str) -> None:
    with pytest.raises(InputError, match=match):
        lift_extra(replace(settings, server=replace(settings.server, extra_args=args)))


@pytest.mark.parametrize(
    "settings", [Settings(merge_qkv=True), Settings(grouped_experts=True), Settings(merge_up_gate=True)]
)
def test_ik_options_on_mainline_are_refused(settings: Settings) -> None:
    with pytest.raises(InputError, match="has no such option"):
        server_options(settings, MAIN)


def test_flag_words_pair_each_flag_with_its_value() -> None:
    assert flag_words(["--seed", "-1", "--no-warmup", "--alias=x", "--ctx-checkpoints", "4"]) == [
        ("--seed", "-1"),
        ("--no-warmup",),
        ("--alias",),
        ("--ctx-checkpoints", "4"),
    ]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, ("127.0.0.1", None)),
        ("0.0.0.0:8000", ("0.0.0.0", 8000)),
        ("192.168.1.5", ("192.168.1.5", None)),
        ("[::]:8000", ("::", 8000)),
        ("::1", ("::1", None)),
        ("localhost:9", ("localhost", 9)),
    ],
)
def test_listen(text: str | None, want: tuple[str, int | None]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["0.0.0.0:", "host:99999", "a:b:c:8", "[::1"])
def test_bad_listen(text: str) -> None:
    with pytest.raises(InputError, match="--listen"):
        parse_listen(text)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("sa") / "m.gguf", "qwen3moe", Dims(n_layer=2), "f16").files[0]


@pytest.fixture
def hw(tmp_path: Path) -> Path:
    p = tmp_path / "hw.yaml"
    p.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    return p


def test_contract_engine_args_render_and_ngl_names_strategy(model: Path, hw: Path) -> None:
    r = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--format",
        "argv",
        "--engine-arg=--no-warmup",
        "--engine-arg=--seed",
        "--engine-arg=7",
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[-3:] == ["--no-warmup", "--seed", "7"]
    r = run_cli("plan", str(model), "--hw", str(hw), "--engine-arg=-ngl", "--engine-arg=10")
    assert r.exit_code == 2 and "--strategy" in r.stderr


def test_contract_engine_args_that_a_plan_option_says(model: Path, hw: Path) -> None:
    args = ("--engine-arg=--merge-qkv", "--engine-arg=--alias", "--engine-arg=GLM-5.1")
    r = run_cli("plan", str(model), "--hw", str(hw), "--engine", "ik_llama.cpp", "--json", *args)
    assert r.exit_code == 0, r.stderr
    import json

    service = json.loads(r.stdout)["services"][0]
    argv = service["argv"]
    assert "--merge-qkv" in argv and argv[argv.index("--alias") + 1] == "GLM-5.1"
    assert service["settings"]["merge_qkv"] and service["settings"]["server"]["alias"] == "GLM-5.1"
    r = run_cli("plan", str(model), "--hw", str(hw), *args)  # mainline has no --merge-qkv
    assert r.exit_code == 2 and "--merge-qkv" in r.stderr and "llama.cpp" in r.stderr, r.stderr


def test_contract_listen_and_key_file(model: Path, hw: Path, tmp_path: Path) -> None:
    key = tmp_path / "key.txt"
    key.write_text("sk-never-in-the-plan\n")
    out = tmp_path / "p.json"
    r = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--listen",
        "0.0.0.0:8000",
        "--api-key-file",
        str(key),
        "--format",
        "argv",
        "-o",
        str(out),
    )
    assert r.exit_code == 0, r.stderr
    argv = r.stdout.split()
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "8000"
    assert argv[argv.index("--api-key-file") + 1] == str(key.resolve())
    assert "reachable from the network" in r.stderr
    assert "sk-never-in-the-plan" not in out.read_text()
    r = run_cli("plan", str(model), "--hw", str(hw), "--listen", "0.0.0.0:8000")
    assert r.exit_code == 0 and "no authentication" in r.stderr


def test_a_layout_service_sets_threads_args_and_env(model: Path, hw: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {
                        "name": "main",
                        "model": str(model),
                        "threads": 2,
                        "threads_batch": 2,
                        "args": ["--no-warmup"],
                        "env": {"GGML_SCHED_MAX_COPIES": "1"},
                    }
                ]
            }
        )
    )
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--json")
    assert r.exit_code == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    argv = doc["services"][0]["argv"]
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-tb") + 1] == "2" and "--no-warmup" in argv
    assert doc["launch"]["processes"][0]["env"] == {"GGML_SCHED_MAX_COPIES": "1"}
    assert "\nGGML_SCHED_MAX_COPIES=1 exec llama-server" in doc["shell"]
    for fmt, want in (
        ("shell", "GGML_SCHED_MAX_COPIES=1 exec llama-server"),
        ("argv", "GGML_SCHED_MAX_COPIES=1 llama-server"),
        ("llama-swap", '    env:\n      - "GGML_SCHED_MAX_COPIES=1"'),
    ):
        r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--format", fmt)
        assert r.exit_code == 0 and want in r.stdout, (fmt, r.stdout)


@pytest.mark.parametrize(
    ("service", "match"),
    [
        ({"env": {"CUDA_VISIBLE_DEVICES": "1"}}, "set by moetune"),
        ({"env": {"A B": "1"}}, "env"),
        ({"args": ["-ub", "64"]}, "use -ub/--ubatch"),
        ({"threads": 2, "args": ["-t", "4"]}, "already says -t/--threads 2"),
    ],
)
def test_a_layout_service_refused(
    model: Path, hw: Path, tmp_path: Path, service: dict[str, object], match: str
) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text(yaml.safe_dump({"services": [{"name": "main", "model": str(model), **service}]}))
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw))
    assert r.exit_code == 2 and match in r.stderr, r.stderr


def test_a_layout_services_args_are_taken_as_its_options(model: Path, hw: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        yaml.safe_dump(
            {"services": [{"name": "main", "model": str(model), "args": ["--alias", "svc", "--temp", "0.6"]}]}
        )
    )
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--json")
    assert r.exit_code == 0, r.stderr
    import json

    server = json.loads(r.stdout)["services"][0]["settings"]["server"]
    assert server["alias"] == "svc" and server["sampling"] == [["temp", 0.6]] and server["extra_args"] == []


def test_extra_flags_an_image_engine_cannot_check_are_said_unchecked(
    model: Path, hw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime-bin"
    runtime.mkdir()
    (runtime / "podman").write_text("#!/bin/sh\nexit 0\n")  # engine add needs only that podman exists
    (runtime / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{runtime}:/usr/bin:/bin")
    r = run_cli("engine", "add", "img", "--kind", "llama.cpp", "--image", "img:latest", "--runtime", "podman")
    assert r.exit_code == 0, r.stderr
    r = run_cli(
        "plan", str(model), "--hw", str(hw), "--engine", "img", "--engine-arg=--no-such-flag", "--format", "argv"
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[-1] == "--no-such-flag" and "--no-such-flag not checked" in r.stderr
    r = run_cli("plan", str(model), "--hw", str(hw), "--engine", "img", "--engine-arg=-ngl", "--engine-arg=1")
    assert r.exit_code == 2 and "--strategy" in r.stderr  # the managed flags still are
    r = run_cli("plan", str(model), "--hw", str(hw), "--engine-arg=--no-warmup")  # a build here: checked, no notice
    assert r.exit_code == 0 and "not checked" not in r.stderr
    r = run_cli("plan", str(model), "--hw", str(hw), "--engine-arg=--bogus")
    assert r.exit_code == 2 and "does not take --bogus" in r.stderr and "llama.cpp" in r.stderr, r.stderr


def test_threads_batch_speeds_the_predicted_prefill_alone(model: Path, tmp_path: Path) -> None:
    hw = tmp_path / "hw16.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 16, "ram_mib": 16000, "ram_bw_gbs": 200}}]})
    )
    import json

    def predicted(*opts: str) -> dict[str, float]:
        r = run_cli("plan", str(model), "--hw", str(hw), "-t", "2", "--json", *opts)
        assert r.exit_code == 0, r.stderr
        return dict(json.loads(r.stdout)["predicted"])

    base, batch = predicted(), predicted("--threads-batch", "16")
    assert batch["tg_tok_s"] == base["tg_tok_s"] and batch["pp_tok_s"] > base["pp_tok_s"] * 1.5, (base, batch)
    assert predicted("--engine-arg=-tb", "--engine-arg=16") == batch  # the same option, said as a flag


def test_a_context_past_the_trained_length_warns_and_rope_scaling_renders(tmp_path: Path, hw: Path) -> None:
    m = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=2, n_ctx_train=4096), "f16").files[0]
    r = run_cli("plan", str(m), "--hw", str(hw), "--ctx", "16384", "--format", "argv")
    assert r.exit_code == 0 and "past the 4,096 the model was trained for" in r.stderr
    assert "--rope-scaling yarn --rope-scale 4.00 --yarn-orig-ctx 4096" in r.stderr
    r = run_cli(
        "plan",
        str(m),
        "--hw",
        str(hw),
        "--ctx",
        "16384",
        "--parallel",
        "2",
        "--rope-scaling",
        "yarn",
        "--format",
        "argv",
    )
    assert r.exit_code == 0 and "trained for" not in r.stderr
    assert r.stdout.split()[-6:] == ["--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "4096"]
    r = run_cli("plan", str(m), "--hw", str(hw), "--ctx", "4096", "--format", "argv")
    assert r.exit_code == 0 and "trained for" not in r.stderr
    r = run_cli("plan", str(m), "--hw", str(hw), "--engine-arg=--rope-scale", "--engine-arg=2")
    assert r.exit_code == 2 and "--rope-scaling" in r.stderr


def test_a_layout_services_env_reaches_the_container_format(model: Path, hw: Path, tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        yaml.safe_dump({"services": [{"name": "main", "model": str(model), "env": {"GGML_SCHED_MAX_COPIES": "1"}}]})
    )
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--format", "podman")
    assert r.exit_code == 0, r.stderr
    assert "-e GGML_SCHED_MAX_COPIES=1" in r.stdout and "GGML_SCHED_MAX_COPIES=1 exec" not in r.stdout
