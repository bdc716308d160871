"""Hardware files: validation at the boundary, and the dataclasses usable without pydantic or yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.hardware.inventory import examples, from_dict, load


def test_the_dataclasses_import_neither_pydantic_nor_yaml() -> None:
    code = (
        "import sys; import moetune.hardware.inventory\n"
        "assert not {'pydantic', 'yaml'} & set(sys.modules), 'imported at module level'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", examples())
def test_every_example_loads(name: str) -> None:
    inv = load(name)
    assert inv.nodes and inv.cpu().mem_mib > 0


def test_a_bad_field_names_its_place(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nodes\.0\.cpu\.cores"):
        from_dict({"nodes": [{"name": "a", "cpu": {"cores": 0, "ram_mib": 1, "ram_bw_gbs": 1}}]})
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load(p)
