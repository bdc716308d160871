"""The loopback hardware file the docs' RPC examples use (docs/launch.md) is shown, and is what they say."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from moetune.hardware.inventory import from_dict
from tests.engine_harness import loopback_hw

README = Path(__file__).resolve().parent.parent / "docs" / "launch.md"


def readme_loop_yaml() -> dict[str, object]:
    m = re.search(r"^```yaml\n(# loop\.yaml:.*?)^```", README.read_text(), re.S | re.M)
    assert m, "docs/launch.md shows no ```yaml block starting with '# loop.yaml:'"
    doc: dict[str, object] = yaml.safe_load(m[1])
    return doc


def test_the_readme_shows_the_loopback_hardware_file_its_examples_use() -> None:
    doc = readme_loop_yaml()
    assert doc == loopback_hw(["127.0.0.1:50052"])  # the harness the tests plan with
    inv = from_dict(doc)
    assert [(d.name, d.node) for d in inv.devices()] == [("RPC0[127.0.0.1:50052]", "w0"), ("CPU", "local")]
    assert "--hw loop.yaml" in README.read_text()
