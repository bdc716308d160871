"""Reference 000's base command ("ベースコマンド": ik_llama.cpp serving GLM-5.1 with every expert in
RAM), produced by `moetune plan` for the GLM-5.1 replica, flag for flag: the server's arguments
(after the image) compared as sets of (flag, value) in one spelling, with each allowed difference
named and explained."""

from __future__ import annotations

import shlex

import pytest

from moetune.model.profile import ModelProfile
from tests.helpers import run_cli

# the arguments after the image in shared/reference/000 (its -m path elided there: "...")
REFERENCE = shlex.split("""
  -m /models/snapshots/.../IQ3_KS/GLM-5.1-IQ3_KS-00001-of-00008.gguf
  --merge-qkv --ctx-size 32768 -ctk q8_0 -ctv q8_0
  --parallel 1 --threads 15 --threads-batch 24
  -b 8192 -ub 8192 -ngl 999
  --cpu-moe -muge -mla 3 -amb 512
  --jinja --host 0.0.0.0 --port 8000
  --warmup-batch --alias GLM-5.1
""")
# one spelling per flag (both spellings mean the same to ik_llama.cpp's parser)
CANONICAL = {
    "--ctx-size": "-c",
    "--threads": "-t",
    "--threads-batch": "-tb",
    "--batch-size": "-b",
    "--ubatch-size": "-ub",
    "--n-gpu-layers": "-ngl",
    "-mqkv": "--merge-qkv",
}
# what moetune decides itself, by flag: the reference's value is not expected
DECIDED = {
    "-m": "the model's path: the replica's, mounted by the container format",
    "--cpu-moe": "moetune renders every placement as explicit -ot rules (the same tensors on the CPU)",
    "-ot": "the --cpu-moe placement, as a rule: every expert tensor on the CPU",
    "-fa": "flash attention stated explicitly (ik_llama.cpp's default is on)",
    "--log-disable": "ik_llama.cpp would write llama.log into the working directory",
}


def pairs(argv: list[str]) -> set[tuple[str, str]]:
    out = set()
    for i, a in enumerate(argv):
        if a.startswith("-") and not a.lstrip("-").isdigit():
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
            out.add((CANONICAL.get(a, a), value))
    return out


# the server's own options, as plan options or as the reference's own flags (--engine-arg)
OPTIONS = ("-t", "15", "--threads-batch", "24", "--merge-qkv", "--muge", "--warmup-batch", "--alias", "GLM-5.1")
AS_FLAGS = tuple(
    f"--engine-arg={a}"
    for a in (
        "--merge-qkv",
        "--threads",
        "15",
        "--threads-batch",
        "24",
        "-muge",
        "--warmup-batch",
        "--alias",
        "GLM-5.1",
    )
)


@pytest.mark.parametrize("options", [OPTIONS, AS_FLAGS], ids=["options", "engine-args"])
def test_reference_000_base_command(glm51: ModelProfile, options: tuple[str, ...]) -> None:
    r = run_cli(
        "plan",
        str(glm51.files[0]),
        "--hw",
        "rtx-pro-6000",
        "--engine",
        "ik_llama.cpp",
        "--strategy",
        "cpu-moe",
        "--ctx",
        "32768",
        "--ctk",
        "q8_0",
        "--ctv",
        "q8_0",
        "--parallel",
        "1",
        "-b",
        "8192",
        "-ub",
        "8192",
        "--amb",
        "512",
        *options,
        "--listen",
        "0.0.0.0:8000",
        "--format",
        "argv",
    )
    assert r.exit_code == 0, r.stderr
    ours = pairs(shlex.split(r.stdout)[1:])
    ref = pairs(REFERENCE)
    missing = {p for p in ref - ours if p[0] not in DECIDED}
    extra = {p for p in ours - ref if p[0] not in DECIDED}
    assert not missing and not extra, (missing, extra)
    allowed = {p[0] for p in (ours ^ ref)}
    assert allowed == set(DECIDED), allowed ^ set(DECIDED)  # each listed difference occurs, no other
    assert ("-ot", r"\.ffn_(up|down|gate|gate_up)_exps=CPU") in ours  # what --cpu-moe means
