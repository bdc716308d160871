"""The bugs the fuzzers found in the log grammars, one regression test each, named after what broke. Each
failed on the code before its fix and checks what the user sees now."""

from __future__ import annotations

import pytest

from moetune.engine.logs import parse_log


@pytest.mark.parametrize(
    "line",
    [
        "0.00.001.000 I llama_context: n_ctx = .",
        "prompt eval time = 1.2.3 ms / 5 tokens",
        "Allocating . GiB of pinned host memory",
        f"graph splits = {'9' * 5000}",
        f"{'1' * 5000}.00.000.000 I load_tensors: CPU model buffer size = 1.0 MiB",
        f"failed to allocate CUDA0 buffer of size {'1' * 400}",  # an int too large for a float: OverflowError
    ],
)
def test_a_number_that_does_not_read_skips_the_line(line: str) -> None:
    # float("1.2.3"), int("."), int() of 5000 digits: ValueError out of parse_log
    for era in (None, "mainline", "legacy"):
        log = parse_log(f"llm_load_tensors: CPU buffer size = 2.0 MiB\n{line}\n", era)
        assert log.lines[1].endswith(line[-20:])


def test_an_allocation_of_thousands_of_digits_is_not_infinite() -> None:
    # float() of 5000 digits is inf: the out-of-memory advice took ceil(inf) (OverflowError)
    from moetune.run import diagnose

    log = parse_log(
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {'1' * 5000} MiB on device 0: cudaMalloc failed\n"
    )
    assert not log.alloc_failures
    d = diagnose.server_exit(
        "s", log, 1, loading=True, layers=[diagnose.LayerExperts(0, "CUDA0", 1.0)], uniform=(1.0, 4), n_ubatch=512
    )
    assert d.message
