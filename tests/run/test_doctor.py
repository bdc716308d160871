"""`moetune doctor`: findings with their evidence, on fixture logs and captured responses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from moetune.run.doctor import Finding, Source, examine
from moetune.run.sources import file_source, load_sources
from tests.helpers import run_cli

FIX = Path(__file__).parents[1] / "fixtures" / "logs"


def findings(*names: str, ram_mib: float | None = None) -> list[Finding]:
    return examine(load_sources([str(FIX / n) for n in names]), ram_mib=ram_mib)


def codes(fs: list[Finding]) -> list[str]:
    return [f.code for f in fs]


def test_think_misses_in_an_ik_session() -> None:
    (f,) = findings("synthetic_ik_prefix_cache_misses.legacy.log", ram_mib=768 * 1024)
    assert f.code == "prefix_cache_miss"
    assert f.data["misses"] == 26 and f.data["think_misses"] == 24
    assert f.data["reevaluated_tokens"] == 31219
    assert "26 prefix-cache misses: 31219 prompt tokens re-evaluated" in f.title
    assert "24 of them diverge at a <think> block" in f.title
    assert "<think>" in f.remedy and "enable_thinking=false" in f.remedy
    texts = [e.text for e in f.evidence]
    assert "Common part does not match fully" in texts
    assert any("<think>The contract" in t for t in texts)


def test_bench_requests_are_not_called_misses() -> None:
    # moetune bench sends cache_prompt false on purpose: only the one real miss is reported, and the
    # deliberate ones are named as left out
    (f,) = findings("real_bench_no_cache.mainline.log")
    assert f.data["misses"] == 1 and f.data["uncached_requests"] == 2
    assert f.title.startswith("1 prefix-cache miss:") and "2 requests asked for no cache" in f.title


def test_think_miss_on_the_real_server() -> None:
    (f,) = findings("real_think_mismatch.mainline.log")
    assert f.code == "prefix_cache_miss" and f.data["think_misses"] == 1
    assert any("old: ..." in e.text for e in f.evidence)


def test_misses_without_think_blame_the_prompt_start() -> None:
    fs = findings("real_queue_parallel1.mainline.log")
    miss = next(f for f in fs if f.code == "prefix_cache_miss")
    assert miss.data["think_misses"] == 0 and "another client on the same slot" in miss.remedy


def test_split_mode_fallback_and_pinned_memory() -> None:
    fs = findings("ref000_glm51_2gpu_exps_cpu.legacy.log", ram_mib=320 * 1024)
    assert codes(fs) == ["split_mode_fallback", "pinned_near_ram"]
    split, pinned = fs
    assert split.title == "split mode 'graph' fell back to 'layer' (is not supported for this model)"
    assert [e.line for e in split.evidence] == [5, 6]
    assert pinned.data["pinned_mib"] == 299.91 * 1024
    assert "94% of RAM (320 GiB)" in pinned.title
    assert pinned.evidence[0].text == "Allocating 299.91 GiB of pinned host memory"
    # the report's own machine has 768 GB: 300 GiB pinned is fine there
    assert codes(findings("ref000_glm51_2gpu_exps_cpu.legacy.log", ram_mib=768 * 1024)) == ["split_mode_fallback"]


def test_queueing_behind_slots() -> None:
    (f,) = [f for f in findings("real_queue_parallel1.mainline.log") if f.code == "slot_queueing"]
    assert f.data["waits"] == 2 and f.data["n_slots"] == 1
    assert "2 requests waited for a free slot (--parallel 1)" in f.title
    assert "raise --parallel" in f.remedy
    assert any("skipping, is_processing = 1" in e.text for e in f.evidence)
    (ik,) = [f for f in findings("synthetic_ik_slot_queue.legacy.log") if f.code == "slot_queueing"]
    assert ik.data["max_wait_s"] == 7.0


def test_rdma_without_being_asked() -> None:
    (f,) = findings("synthetic_rpc_worker_rdma.log")
    assert f.code == "rdma_unrequested"
    assert [e.text for e in f.evidence][-2:] == [
        "RDMA probed: dev=rocep1s0f1 gid=3 RoCEv2 qpn=1377 inline=220",
        "RDMA activated: qpn=1377->1389 mtu=4096 rx_depth=64",
    ]
    assert "GGML_RPC_NO_RDMA=1" in f.remedy
    src = file_source(FIX / "synthetic_rpc_worker_rdma.log", env={"GGML_RDMA_DEV": "rocep1s0f1"})
    assert examine([src]) == []  # asked for
    unasked = file_source(FIX / "synthetic_rpc_worker_rdma.log", env={"PATH": "/usr/bin"})
    assert "GGML_RDMA_DEV was not set" in examine([unasked])[0].title
    assert findings("real_rpc_worker.log") == []  # TCP only


def test_thinking_dominates(tmp_path: Path) -> None:
    def resp(reasoning: str, content: str, n: int, n_reasoning: int | None = None) -> dict[str, object]:
        usage: dict[str, object] = {"completion_tokens": n}
        if n_reasoning is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": n_reasoning}
        return {
            "choices": [{"message": {"role": "assistant", "reasoning_content": reasoning, "content": content}}],
            "usage": usage,
            "timings": {"predicted_n": n},
        }

    # report 000: 355 tokens = 294 thinking + 61 content for a short JSON answer
    path = tmp_path / "responses.jsonl"
    path.write_text(
        "\n".join(json.dumps(r) for r in [resp("x" * 1200, "y" * 250, 355, 294), resp("x" * 900, "y" * 300, 300)])
    )
    (f,) = examine([file_source(path)])
    assert f.code == "thinking_dominant"
    assert f.data["completion_tokens"] == 655 and f.data["thinking_tokens"] == 294 + 225
    assert "enable_thinking" in f.remedy
    assert f.evidence[0].text.startswith("response 1: completion_tokens=355")
    quiet = tmp_path / "quiet.json"
    quiet.write_text(json.dumps(resp("", "y" * 300, 61)))
    assert examine([file_source(quiet)]) == []


def test_failed_load_is_a_finding() -> None:
    (f,) = findings("ref000_glm51_oom_n_cpu_moe_58.legacy.log")
    assert f.code == "load_failed" and f.data["cause"] == "out_of_memory"
    assert "CUDA0 compute buffer (5418 MiB)" in f.title


def test_nothing_to_say() -> None:
    assert examine([Source(name="empty")]) == []
    assert findings("real_serve.mainline.log") == []


def test_doctor_cli(tmp_path: Path) -> None:
    r = run_cli(
        "doctor",
        str(FIX / "synthetic_ik_prefix_cache_misses.legacy.log"),
        str(FIX / "ref000_glm51_2gpu_exps_cpu.legacy.log"),
        "--ram-gib",
        "320",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["code"] for d in doc] == [
        "prefix_cache_miss",
        "pinned_near_ram",
        "split_mode_fallback",
        "pinned_near_ram",
    ]
    assert doc[0]["evidence"][0] == {
        "line": 11,
        "text": "======== Cache: cache_size = 2210, n_past =  1898, n_past_prompt = 1898",
    }
    text = run_cli("doctor", str(FIX / "ref000_glm51_2gpu_exps_cpu.legacy.log"))
    assert text.exit_code == 0
    assert "split_mode_fallback" in text.stdout and "Split mode 'graph' is not supported" in text.stdout
    assert run_cli("doctor", str(FIX / "real_serve.mainline.log")).stdout.strip() == "no findings"
    missing = run_cli("doctor", str(tmp_path / "nope.log"))
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def launched(
    run_id: str,
    created_at: float,
    log_fixture: str | None,
    *,
    argv: Sequence[str] = ("llama-server",),
    exit_code: int | None = None,
) -> str:
    """A launch's run directory as `moetune launch` leaves it: run.json, and a server with its log
    (a fixture's, or empty)."""
    import shutil

    from moetune.kinds import LaunchState, ProcessRole
    from moetune.run.record import ProcRecord, RunDir, RunInfo

    rd = RunDir.create(
        RunInfo(
            run=run_id,
            created_at=created_at,
            state=LaunchState.STOPPED,
            launch={},
            engines={},
            fingerprint="fp",
            machine={},
            launcher_pid=1,
            detached=False,
        ),
        {},
    )
    rd.add_proc(
        ProcRecord(
            name="main",
            role=ProcessRole.SERVER,
            node="local",
            host="127.0.0.1",
            port=8080,
            argv=list(argv),
            env={},
            env_inherited={},
            log="main.log",
            exit_code=exit_code,
        )
    )
    if log_fixture is None:
        rd.log_path("main").write_text("")
    else:
        shutil.copy(FIX / log_fixture, rd.log_path("main"))
    return run_id


def test_doctor_takes_run_references_as_compare_does(tmp_path: Path) -> None:
    from moetune.kinds import RunKind
    from moetune.store.db import ResultsDB
    from moetune.store.record import RunMeta

    assert (r := run_cli("doctor", "latest")).exit_code == 2 and "no launched runs yet" in r.stderr
    older = launched("20260101-100000-aaaa", 1_767_261_600.0, "real_queue_parallel1.mainline.log")
    newer = launched("20260102-100000-bbbb", 1_767_348_000.0, "real_think_mismatch.mainline.log")
    db = tmp_path / "r.sqlite"
    with ResultsDB.open(db) as h:
        h.create_run(RunMeta(kind=RunKind.BENCH, launch_run=older), label="parallel-1", target="http://127.0.0.1:8080")
        h.create_run(RunMeta(kind=RunKind.BENCH), label="by-hand", target="http://10.0.0.2:8080")

    latest = run_cli("doctor", "latest", "--json", "--db", str(db))
    assert latest.exit_code == 0, latest.stderr
    assert {(d["source"], d["code"]) for d in json.loads(latest.stdout)} == {(f"{newer}/main", "prefix_cache_miss")}
    for ref in (older, "1", "parallel-1"):  # a launch's id, or a benchmark run's id or label
        r = run_cli("doctor", ref, "--json", "--db", str(db))
        assert r.exit_code == 0, (ref, r.stderr)
        assert {d["source"] for d in json.loads(r.stdout)} == {f"{older}/main"}
        assert "slot_queueing" in {d["code"] for d in json.loads(r.stdout)}
    unlaunched = run_cli("doctor", "by-hand", "--db", str(db))
    assert unlaunched.exit_code == 2
    assert "benchmark run 2 (by-hand) measured http://10.0.0.2:8080, which moetune did not launch" in unlaunched.stderr
    for ref in ("nosuch", "typo.log"):
        unknown = run_cli("doctor", ref, "--db", str(db))
        assert unknown.exit_code == 2 and f"'{ref}': no such file, launch or benchmark run" in unknown.stderr
    with ResultsDB.open(db) as h:
        h.create_run(RunMeta(kind=RunKind.BENCH, launch_run=older), label="q4.k", target="http://127.0.0.1:8080")
    assert run_cli("doctor", "q4.k", "--db", str(db)).exit_code == 0
