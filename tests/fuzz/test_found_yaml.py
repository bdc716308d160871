"""The bugs the fuzzers found in the hardware and layout files, one regression test each, named after
what broke. Each failed on the code before its fix and checks what the user sees now."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.hardware import inventory
from moetune.layout_schema import read_layout
from tests.fuzz.gguf_cases import tiny_model
from tests.helpers import run_cli


def test_a_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    # PyYAML's message quotes the line with a caret under it: four lines after "Error:"
    p = tmp_path / "hw.yaml"
    p.write_text("nodes:\n  - name: a\n   cpu: {cores: 1}\n")
    r = run_cli("plan", str(tiny_model(tmp_path / "m.gguf")), "--hw", str(p))
    assert r.exit_code == 2
    assert "line 3, column 4: " in r.stderr.splitlines()[0]
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_layout_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    # read_text() raised UnicodeDecodeError
    p = tmp_path / "layout.yaml"
    p.write_bytes(b"services:\n  - name: \xff\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_layout(p)


def test_a_key_with_a_line_break_is_named_on_one_line(tmp_path: Path) -> None:
    # pydantic's location quoted the document's key as is
    p = tmp_path / "hw.yaml"
    p.write_text('nodes:\n  - name: a\n    "x\\ny": 1\n    cpu: {cores: 1, ram_mib: 1, ram_bw_gbs: 1}\n')
    with pytest.raises(InputError) as e:
        inventory.load(p)
    assert "\n" not in str(e.value) and "x\\ny" in str(e.value)


def test_a_path_with_a_line_break_prints_on_one_line(tmp_path: Path) -> None:
    # a layout naming a model path with a line break: "no such GGUF file" printed on two lines
    (tmp_path / "layout.yaml").write_text('services:\n  - {name: a, model: "x\\ny.gguf"}\n')
    r = run_cli("plan", "--layout", str(tmp_path / "layout.yaml"), "--hw", "rtx-pro-6000x2")
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0].startswith("Error: ") and "x\\ny.gguf" in r.stderr.splitlines()[0], r.stderr


@pytest.mark.parametrize("value", [".inf", "1e309", ".nan"])
def test_an_infinite_amount_in_a_hardware_file_is_refused(tmp_path: Path, value: str) -> None:
    # `reserved_mib: 1e309` (YAML: infinity) passed `ge=0` and the plan took int() of it (OverflowError)
    p = tmp_path / "hw.yaml"
    p.write_text(f"nodes:\n  - name: a\n    cpu: {{cores: 2, ram_mib: 4096, ram_bw_gbs: 50, reserved_mib: {value}}}\n")
    with pytest.raises(InputError, match="reserved_mib"):
        inventory.load(p)
