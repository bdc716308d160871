"""Fuzzing the GGUF reader and the model profile: mutated real headers end in a profile (and a plan)
or in one clean moetune error; never another exception, never a hang, never unbounded memory.

The target is what `moetune plan MODEL --hw HW` does with a file: read every header, build the
profile, show it (`inspect --json`) and plan it. The remote reader is held to the local one: the
same bytes served by Range requests, the header fetched in growing pieces, give the same result
or the same error.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moetune.app.plan import PlanRequest
from moetune.app.plan import plan as plan_files
from moetune.errors import MoetuneError, RuntimeFailure
from moetune.model import remote
from moetune.model.gguf_read import GGUFFile, parse
from moetune.model.profile import load_profile
from moetune.report.inspect_view import inspect_json
from tests.fuzz.budget import fuzz, note_event
from tests.fuzz.gguf_cases import (
    MetaCase,
    Mutated,
    bases,
    mutated_bytes,
    mutated_metadata,
    seeds,
)
from tests.fuzz.guard import bounded

_names = itertools.count()

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-gguf")


def _fresh(workdir: Path) -> Path:
    # a new name each time: the profile cache keys on path, size and mtime, and two rewrites of one
    # path within a clock tick would look alike
    return workdir / f"case-{next(_names)}.gguf"


def plan_or_clean_error(path: Path) -> str:
    """What `moetune inspect --json` and `moetune plan` do with the file: "ok", or the error's line."""
    try:
        with bounded():
            profile = load_profile(path)
            json.dumps(inspect_json(profile), default=str)
            plan_files(PlanRequest(hw="rtx-pro-6000x2", model=path))
    except MoetuneError as e:
        assert str(e) and "\n" not in str(e), f"not one line: {e!r}"
        note_event(f"error: {_gist(str(e))}")
        return f"error: {e}"
    note_event("planned")
    return "ok"


def _gist(message: str) -> str:
    """The kind of an error, for Hypothesis's statistics: the message without its path and numbers."""
    words = re.sub(r"'[^']*'|\d+|b'.*", "_", message.split(": ", 1)[-1]).split()
    return " ".join(words[:5])


@given(case=mutated_bytes(bases(), seeds()))
@fuzz(1500)
def test_a_mutated_header_gives_a_profile_or_a_clean_error(case: Mutated, workdir: Path) -> None:
    path = _fresh(workdir)
    path.write_bytes(case.data)
    plan_or_clean_error(path)
    path.unlink()


@given(case=mutated_metadata(bases()))
@fuzz(800)
def test_hostile_metadata_values_give_a_profile_or_a_clean_error(case: MetaCase, workdir: Path) -> None:
    path = _fresh(workdir)
    case.write(path)
    plan_or_clean_error(path)
    path.unlink()


# ---- the remote reader against the local one ---------------------------------------------------


class _Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self._body = status, headers, body

    def read(self, n: int) -> bytes:
        out, self._body = self._body[:n], self._body[n:]
        return out

    def close(self) -> None:
        pass

    def __enter__(self) -> _Reply:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class BytesServer(remote.Client):
    """A client whose server holds one file and answers Range requests as a static server does."""

    def __init__(self, data: bytes) -> None:
        super().__init__(timeout_s=1)
        self.data = data

    def get(self, url: str, start: int | None = None, end: int | None = None) -> tuple[str, Any]:
        self.stats.add(requests=1)
        size, s = len(self.data), start or 0
        if s >= size:
            return url, _Reply(416, {"Content-Range": f"bytes */{size}"}, b"")
        e = size if end is None else min(end, size)
        return url, _Reply(206, {"Content-Range": f"bytes {s}-{e - 1}/{size}"}, self.data[s:e])


class _Whole:
    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.size, self.data = path, len(data), data

    def prefix(self, end: int) -> bytes:
        return self.data


def _outcome(read: Iterator[GGUFFile]) -> str:
    try:
        with bounded():
            return repr(next(read))  # repr: NaN values compare equal
    except MoetuneError as e:
        return f"{type(e).__name__}: {e}"


def _remote(data: bytes, url: str, first: int) -> Iterator[GGUFFile]:
    src = remote.HttpSource(BytesServer(data), url, first_chunk=first)
    yield parse(src)


def _local(data: bytes, url: str) -> Iterator[GGUFFile]:
    yield parse(_Whole(url, data))


@given(case=mutated_bytes(bases(), seeds()), first=st.integers(1, 1 << 18))
@fuzz(500)
def test_the_remote_reader_agrees_with_the_local_one(case: Mutated, first: int) -> None:
    raw = case.data
    url = "http://127.0.0.1:1/m.gguf"
    assert _outcome(_remote(raw, url, first)) == _outcome(_local(raw, url))


@given(
    value=st.one_of(
        st.none(), st.text(max_size=40), st.from_regex(r"\s*bytes\s+(\d{1,25}-\d{1,25}|\*)/(\d{1,25}|\*)\s*")
    )
)
@fuzz(300)
def test_a_content_range_header_parses_or_fails_cleanly(value: str | None) -> None:
    try:
        start, size = remote._content_range(value, "http://127.0.0.1:1/m.gguf")
    except RuntimeFailure:
        return
    assert size >= 0 and (start is None or start >= 0)


@example(b"")
@given(raw=st.binary(max_size=64))
@fuzz(200)
def test_random_bytes_are_not_a_gguf_file(raw: bytes) -> None:
    assert _outcome(_local(raw, "random.gguf")).startswith("InputError: ")
