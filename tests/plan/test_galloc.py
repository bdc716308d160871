"""The scheduler and allocator rules of plan/galloc.py, one rule per table, on hand-made graphs.

Sizes are bytes; each case names the rule of ggml-backend.cpp / ggml-alloc.c it follows.
"""

from __future__ import annotations

import pytest

from moetune.plan.galloc import CPU, Node, assign, buffer_sizes

GPU, RPC = "CUDA0", "RPC0"


def N(name: str, nbytes: int, *srcs: str, **kw: object) -> Node:  # a table-friendly constructor
    return Node(name=name, nbytes=nbytes, srcs=tuple(srcs), **kw)  # type: ignore[arg-type]


# (case, nodes, peak bytes on the CPU): ggml_dyn_tallocr on one buffer
ALLOCATOR = [
    # a freed block is reused when the next tensor fits in it
    ("reuse", [N("a", 100, weight=CPU), N("b", 100, "a", weight=CPU), N("c", 100, "b", weight=CPU)], 200),
    # a tensor that does not fit any hole goes to the end, and the buffer grows past the hole
    ("hole too small", [N("a", 100, weight=CPU), N("b", 50, "a", weight=CPU), N("c", 150, "b", weight=CPU)], 300),
    # the smallest block that holds it, not the first: c takes the 60-byte hole, so d fits the 100-byte one
    (
        "best fit",
        [
            N("x", 100, weight=CPU),
            N("y", 10, weight=CPU),
            N("z", 60, weight=CPU),
            N("w", 10, weight=CPU),
            N("u", 1, "x", "z", weight=CPU),
            N("c", 50, weight=CPU),
            N("d", 100, weight=CPU),
        ],
        181,
    ),
    # a tensor nobody reads is never freed
    ("unread stays", [N("a", 100, weight=CPU), N("b", 100, weight=CPU), N("c", 100, "b", weight=CPU)], 300),
    # a pinned tensor (read by a view nobody reads) is never freed either
    ("pinned", [N("a", 100, weight=CPU, pinned=True), N("b", 100, "a", weight=CPU), N("c", 100, "b", weight=CPU)], 300),
    # an element-wise op takes over its source's buffer when it is that source's last reader
    ("in place", [N("a", 100, weight=CPU), N("b", 100, "a", inplace=True), N("c", 100, "b", weight=CPU)], 200),
    (
        "not in place when read later",
        [N("a", 100, weight=CPU), N("b", 100, "a", inplace=True), N("c", 100, "a", "b", weight=CPU)],
        300,
    ),
    # it takes the first source it can: here the second, the first being read again later
    (
        "in place, second source",
        [
            N("a", 100, weight=CPU),
            N("r", 100, weight=CPU),
            N("b", 100, "a", "r", inplace=True),
            N("c", 150, "b", "a", weight=CPU),
        ],
        350,
    ),
    # leafs are allocated before every node, whatever their place in the graph
    (
        "leafs first",
        [
            N("a", 100, weight=CPU),
            N("b", 100, "a", weight=CPU),
            N("l", 100, leaf=True, is_input=True),
            N("c", 100, "b", "l", weight=CPU),
        ],
        300,
    ),
]


@pytest.mark.parametrize(("nodes", "peak"), [c[1:] for c in ALLOCATOR], ids=[c[0] for c in ALLOCATOR])
def test_allocator(nodes: list[Node], peak: int) -> None:
    assert buffer_sizes(nodes, [CPU])[CPU] == peak


# (case, nodes, devices, offload_to, expected devices of named nodes): the scheduler's passes
ASSIGN = [
    # ops follow their weights; inputs live on the CPU
    (
        "weights",
        [N("in", 1, leaf=True, is_input=True), N("a", 1, "in", weight=GPU), N("b", 1, "a", weight=CPU)],
        [GPU, CPU],
        "",
        {"in": CPU, "a": GPU, "b": CPU},
    ),
    # an op without a weight takes the accelerator before it (expand down)...
    ("expand down", [N("a", 1, weight=GPU), N("b", 1, "a"), N("c", 1, "b", weight=CPU)], [GPU, CPU], "", {"b": GPU}),
    # ...or, after a CPU op, the accelerator after it (expand up): the tail of a layer whose experts
    # run on the CPU goes to the device of the next op with a weight
    ("expand up", [N("a", 1, weight=CPU), N("b", 1, "a"), N("c", 1, "b", weight=RPC)], [RPC, CPU], "", {"b": RPC}),
    # with no accelerator around, the CPU spreads
    ("cpu only", [N("a", 1, weight=CPU), N("b", 1, "a")], [CPU], "", {"b": CPU}),
    # a views runs where its source is; a leaf that is not an input where its first reader is
    (
        "views and leafs",
        [N("a", 1, weight=GPU), N("v", 0, "a", view_of="a"), N("l", 1, leaf=True), N("b", 1, "l", weight=RPC)],
        [RPC, GPU, CPU],
        "",
        {"v": GPU, "l": RPC},
    ),
    # a GPU runs the large-batch matmuls of host weights (op offload), not the small ones
    (
        "offload",
        [N("a", 1, weight=CPU, batch=512), N("b", 1, "a", weight=CPU, batch=16)],
        [GPU, CPU],
        GPU,
        {"a": GPU, "b": CPU},
    ),
]


@pytest.mark.parametrize(
    ("nodes", "devices", "offload_to", "want"), [c[1:] for c in ASSIGN], ids=[c[0] for c in ASSIGN]
)
def test_assign(nodes: list[Node], devices: list[str], offload_to: str, want: dict[str, str]) -> None:
    got = assign(nodes, devices, offload_to)
    assert {k: got[k] for k in want} == want


def test_a_tensor_read_on_another_device_is_copied_there_and_the_original_freed_after_the_copy() -> None:
    nodes = [
        N("in", 100, leaf=True, is_input=True),
        N("x", 100, "in", weight=CPU),
        N("y", 100, "x", weight=RPC),
        N("z", 100, "y", weight=RPC),
        N("w", 300, weight=CPU),
    ]
    # CPU: the input and x (freed once x is copied), then w from the start of the buffer; RPC0: the copy of x,
    # y beside it, z in the copy's block once y has read it
    sizes = buffer_sizes(nodes, [RPC, CPU])
    assert sizes == {RPC: 200, CPU: 300}


def test_offloaded_matmul_copies_its_weight_into_the_gpu_buffer() -> None:
    nodes = [N("x", 100, weight=GPU), N("e", 50, "x", weight=CPU, batch=64, weight_bytes=1000)]
    assert buffer_sizes(nodes, [GPU, CPU], offload_to=GPU) == {GPU: 1150, CPU: 0}
    assert buffer_sizes(nodes, [GPU, CPU]) == {GPU: 100, CPU: 150}  # no offload: x copied to the CPU


def test_pipeline_parallelism_keeps_four_copies_of_every_input() -> None:
    nodes = [N("in", 10, leaf=True, is_input=True), N("a", 100, "in", weight=GPU), N("b", 100, "a", weight=RPC)]
    one = buffer_sizes(nodes, [RPC, GPU, CPU])
    four = buffer_sizes(nodes, [RPC, GPU, CPU], n_copies=4)
    assert one == {RPC: 200, GPU: 110, CPU: 10}
    # graph inputs x4 on the CPU, split inputs (the copies of `in` on the GPU, of `a` on RPC0) x4, never freed
    assert four == {RPC: 500, GPU: 140, CPU: 40}
