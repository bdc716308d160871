"""Fuzzing the hardware and layout files: a mutated document, or a mangled file, ends in a plan or in
one clean InputError (exit 2), never in a traceback, a hang or unbounded memory.

The target is `moetune plan`: the hardware file read (YAML, the schema, the bind checks) and a tiny
model planned on it; the layout file read with its models and planned.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moetune.app.plan import PlanRequest
from moetune.app.plan import plan as plan_files
from moetune.errors import InputError, MoetuneError
from moetune.hardware import inventory
from tests.fuzz.budget import fuzz, note_event
from tests.fuzz.gguf_cases import tiny_model
from tests.fuzz.guard import bounded
from tests.fuzz.yaml_cases import Doc, hardware_texts, layout_texts, mangled_texts, mutated_docs

_names = itertools.count()

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-yaml")
    tiny_model(d / "model.gguf")
    return d


def plan_or_input_error(req: PlanRequest) -> None:
    """`moetune plan` on these files: a plan, or an InputError of one line (exit 2)."""
    try:
        with bounded():
            plan_files(req)
    except MoetuneError as e:
        assert isinstance(e, InputError), f"bad input must exit 2, not {type(e).__name__}: {e}"
        assert str(e)  # one line as the CLI prints it (it escapes what the documents quote: paths, names)
        note_event("refused: " + " ".join(str(e).split(": ", 2)[1:2])[:40])
        return
    note_event("planned")


def _write(workdir: Path, doc: Doc) -> Path:
    p = workdir / f"case-{next(_names)}.yaml"
    p.write_bytes(doc.text)
    return p


@given(doc=st.one_of(mutated_docs(hardware_texts()), mangled_texts(hardware_texts())))
@fuzz(600)
def test_a_mutated_hardware_file_plans_or_is_refused_cleanly(doc: Doc, workdir: Path) -> None:
    plan_or_input_error(PlanRequest(hw=str(_write(workdir, doc)), model=workdir / "model.gguf"))


@given(doc=st.one_of(mutated_docs(layout_texts()), mangled_texts(layout_texts())))
@fuzz(600)
def test_a_mutated_layout_file_plans_or_is_refused_cleanly(doc: Doc, workdir: Path) -> None:
    plan_or_input_error(PlanRequest(hw="rtx-pro-6000x2", layout=_write(workdir, doc)))


@example(text="")
@example(text="[" * 5000)
@given(text=st.text(max_size=200))
@fuzz(300)
def test_any_text_as_a_hardware_file_plans_or_is_refused_cleanly(text: str, workdir: Path) -> None:
    p = workdir / f"case-{next(_names)}.yaml"
    p.write_text(text)
    try:
        with bounded():
            inventory.load(p)
    except InputError as e:
        assert "\n" not in str(e), f"not one line: {e!r}"
