"""Start a mock server script in its own interpreter (so it keeps its schedule while the client
works), read the URL it prints, and stop it with the product's own ``end`` on leaving."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from moetune.run.process import end


@contextlib.contextmanager
def mock_process(
    script: str | Path, config_json: str, *, url_prefix: str, what: str, timeout_s: float = 20
) -> Iterator[str]:
    """Run ``script --config CONFIG_JSON``; yield the first line it prints (its URL, which must start
    with ``url_prefix``)."""
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a pipe nobody reads fills and blocks
        proc = subprocess.Popen(
            [sys.executable, str(script), "--config", config_json], stdout=subprocess.PIPE, stderr=errors, text=True
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if not line.startswith(url_prefix):
                proc.kill()
                proc.wait(timeout_s)
                errors.seek(0)
                raise RuntimeError(f"{what} did not start: {errors.read()[-2000:].decode(errors='replace')}")
            yield line
        finally:
            end(proc, timeout_s)
            if proc.stdout is not None:
                proc.stdout.close()
