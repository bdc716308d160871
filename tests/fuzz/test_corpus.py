"""The seed corpus (tests/fuzz/corpus, written by make_corpus.py) replayed through every target:
each file once broke a reader or sits at an edge the random search rarely reaches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from moetune.app.plan import PlanRequest
from tests.fuzz.gguf_cases import corpus_files, read_corpus_gguf, tiny_model
from tests.fuzz.test_gguf import plan_or_clean_error
from tests.fuzz.test_logs import read_server_log
from tests.fuzz.test_sse import conn_outcome, serve_record, single_outcome
from tests.fuzz.test_yaml import plan_or_input_error

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-corpus")
    tiny_model(d / "model.gguf")
    return d


def _ids(p: Path) -> str:
    return p.name


@pytest.mark.parametrize("path", corpus_files("gguf"), ids=_ids)
def test_a_corpus_model_plans_or_is_refused_cleanly(path: Path, workdir: Path) -> None:
    target = workdir / path.name.removesuffix(".gz")
    target.write_bytes(read_corpus_gguf(path))
    plan_or_clean_error(target)


@pytest.mark.parametrize("path", corpus_files("hardware"), ids=_ids)
def test_a_corpus_hardware_file_plans_or_is_refused_cleanly(path: Path, workdir: Path) -> None:
    plan_or_input_error(PlanRequest(hw=str(path), model=workdir / "model.gguf"))


@pytest.mark.parametrize("path", corpus_files("layout"), ids=_ids)
def test_a_corpus_layout_plans_or_is_refused_cleanly(path: Path, workdir: Path) -> None:
    shutil.copy(path, workdir / path.name)  # beside the model it names
    plan_or_input_error(PlanRequest(hw="rtx-pro-6000x2", layout=workdir / path.name))


@pytest.mark.parametrize("path", corpus_files("logs"), ids=_ids)
def test_a_corpus_log_parses_in_every_era(path: Path) -> None:
    text = path.read_text(errors="replace")
    for era in (None, "mainline", "legacy"):
        read_server_log(text, era)


@pytest.mark.parametrize("path", [p for p in corpus_files("sse") if p.suffix == ".sse"], ids=_ids)
def test_a_corpus_stream_cut_at_every_byte_reads_as_the_whole(path: Path) -> None:
    data = path.read_bytes()
    bytewise = [data[i : i + 1] for i in range(len(data))]
    assert serve_record(bytewise) == serve_record([data])
    assert single_outcome(bytewise) == single_outcome([data])


@pytest.mark.parametrize("path", [p for p in corpus_files("sse") if p.suffix == ".http"], ids=_ids)
def test_a_corpus_response_cut_at_every_byte_reads_as_the_whole(path: Path) -> None:
    data = path.read_bytes()
    for closed in (False, True):
        assert conn_outcome([data[i : i + 1] for i in range(len(data))], closed) == conn_outcome([data], closed)
