"""The speed constants' reader and the shortfall's reader of a plan document: what they keep,
what they leave out, and that the constants come back as they were stored."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from moetune.errors import InputError
from moetune.plan.ledger import Shortfall
from moetune.plan.speed import SpeedConstants, at_depth


def test_stored_constants_read_back_as_they_were_written() -> None:
    k = SpeedConstants(gpu_tflops=80.0, offload_min_batch=64)
    again = SpeedConstants.from_json(json.loads(json.dumps(asdict(k))))
    assert again == k
    assert isinstance(again.offload_min_batch, int)


def test_unknown_names_and_values_that_are_no_number_are_left_out() -> None:
    k = SpeedConstants.from_json({"gpu_tflops": 90, "no_such_constant": 1.0, "cpu_gflops_per_core": "fast"})
    assert k.gpu_tflops == 90
    assert k.cpu_gflops_per_core == SpeedConstants().cpu_gflops_per_core
    assert json.dumps(asdict(k)["gpu_tflops"]) == "90"  # an int stays an int in the document
    assert SpeedConstants.from_json(None) == SpeedConstants()


def test_overrides_set_the_named_constants_and_refuse_the_rest() -> None:
    k = SpeedConstants().with_overrides({"gpu_tflops": "120", "offload_min_batch": "16"})
    assert (k.gpu_tflops, k.offload_min_batch) == (120.0, 16)
    assert isinstance(k.offload_min_batch, int)
    with pytest.raises(InputError, match="unknown constant"):
        SpeedConstants().with_overrides({"warp_speed": "9"})


def test_a_prediction_stored_without_its_work_has_no_figures_at_depth() -> None:
    assert at_depth({"tg_tok_s": 10.0}, 1024) is None


def test_a_shortfall_reads_back_from_the_plan_document() -> None:
    sf = Shortfall(device="CUDA0", what="kv", needed_mib=99000.0, capacity_mib=97800.0, margin_mib=512.0)
    again = Shortfall.from_json(json.loads(json.dumps(sf.to_json())))
    assert again.message() == sf.message()
    older = {k: v for k, v in sf.to_json().items() if k != "margin_mib"}  # plans written before it
    assert Shortfall.from_json(older).margin_mib == 0.0
    with pytest.raises(TypeError):
        Shortfall.from_json({**sf.to_json(), "needed_mib": None})
