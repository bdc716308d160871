"""The routed experts' tensor kinds come from one table (model.profile.EXPERT_KINDS): the `-ot`
patterns, the routing counts' names and the ik_llama.cpp split all follow it."""

from __future__ import annotations

import re

import pytest

from moetune.engine import ik_split, render
from moetune.model import routing
from moetune.model.profile import EXPERT, EXPERT_KINDS, EXPERT_PARTS, expert_part, tensor_kind, tensor_role

OTHERS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp")


@pytest.mark.parametrize("kind", EXPERT_KINDS)
def test_each_kind_is_an_expert_and_its_part_writes_it_back(kind: str) -> None:
    assert tensor_role(kind) == EXPERT
    assert tensor_kind(f"blk.7.{kind}.weight") == (7, kind)
    assert f"ffn_{expert_part(kind)}_exps" == kind


def test_the_parts() -> None:
    assert EXPERT_PARTS == ("gate", "up", "down", "gate_up")


def test_the_all_experts_pattern_is_the_one_users_know_and_matches_every_kind() -> None:
    assert render.ALL_EXPERTS == r"\.ffn_(up|down|gate|gate_up)_exps"
    rx = re.compile(render.ALL_EXPERTS)
    assert all(rx.search(f"blk.3.{k}.weight") for k in EXPERT_KINDS)
    assert not any(rx.search(f"blk.3.{k}.weight") for k in OTHERS)


def test_routing_reads_the_counts_of_every_kind() -> None:
    assert sorted(routing._PREFERRED) == sorted(EXPERT_PARTS)
    for k in EXPERT_KINDS:
        m = routing._COUNTS.match(f"blk.12.{k}.weight.counts")
        assert m is not None and (m[1], m[2]) == ("12", expert_part(k))
    assert not any(routing._COUNTS.match(f"blk.12.{k}.weight.counts") for k in OTHERS)


def test_the_ik_split_counts_the_same_kinds() -> None:
    assert set(EXPERT_KINDS) == ik_split._EXPS
