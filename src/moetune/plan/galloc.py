"""llama.cpp's compute-buffer sizing, replayed: the scheduler's graph splits and ggml-alloc's allocator.

llama.cpp sizes each device's compute buffer by allocating the worst-case graph without running it
(``llama_context::sched_reserve``, then ``ggml_backend_sched_reserve_size``). Three rules decide
the result, each followed here as the engine's source states it (build 11434):

1. Where each node runs (``ggml/src/ggml-backend.cpp``, ``ggml_backend_sched_split_graph``): an
   op that reads a weight runs on the weight's device (``ggml_backend_sched_backend_id_from_cur``),
   unless the weight is in host memory and a GPU offloads the op (CUDA: a matmul of 32 tokens or
   more, ``ggml_backend_cuda_device_offload_op``); graph inputs live on the CPU; the other ops take
   the device of their neighbours, spreading the accelerators down then up the graph, then any
   device (the four "expand" passes). Leafs that are not inputs take their consumer's device.
2. What is copied where (same function): a run of nodes on one device is a split; every tensor it
   reads from another device is copied into that device's compute buffer, allocated when the split
   starts (with the other inputs of the split) and kept until its last reader there; the original
   is kept until the copy is made. A node whose weight must be copied starts a new split.
3. How the buffer is laid out (``ggml/src/ggml-alloc.c``, ``ggml_gallocr_alloc_graph_impl`` and
   ``ggml_dyn_tallocr_alloc``): leafs are allocated first; each node is allocated when reached and
   each of its sources freed after its last reader; a tensor nobody reads is never freed; an
   element-wise op may take over the buffer of its only remaining reader's source (in place); a
   new tensor goes to the smallest free block that holds it, or else to the end of the buffer,
   which grows. The buffer's size is the highest end ever reached, holes included.

The graph itself is a coarse copy of the model's (``moetune.plan.graph``): the tensors that matter
for memory, in the engine's order. Pure: nodes in, bytes per device out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CPU = "CPU"
OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu: GGML_OP_OFFLOAD_MIN_BATCH, default 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One tensor of the graph: a leaf (an input, or a constant the graph fills) or an op's result."""

    name: str
    nbytes: int
    srcs: tuple[str, ...] = ()  # tensors it reads (weights are not listed: see ``weight``)
    weight: str = ""  # device of the weight it reads: the op runs there (rule 1)
    weight_bytes: int = 0  # that weight's size, copied into the device's buffer when the op is offloaded
    batch: int = 0  # the op's batch for the offload check (tokens of a matmul); 0: never offloaded
    inplace: bool = False  # may take over a source's buffer (``ggml_op_can_inplace``, same layout), the first that can
    leaf: bool = False  # allocated before every node (graph inputs, tensors the graph fills)
    is_input: bool = False  # a graph input: lives on the CPU (``GGML_TENSOR_FLAG_INPUT``)
    pinned: bool = False  # read by a view nobody reads: never freed
    view_of: str = ""  # a view (allocates nothing) of this tensor; runs on its device


def assign(nodes: Sequence[Node], devices: Sequence[str], offload_to: str = "") -> dict[str, str]:
    """Rule 1: the device of every node. ``devices`` in the scheduler's priority order (the CPU,
    lowest, last); ``offload_to``: the GPU that runs host-weight matmuls of large batches."""
    dev: dict[str, str] = {}
    for n in nodes:
        if n.is_input:
            dev[n.name] = CPU
        elif n.weight:
            off = offload_to and n.weight == CPU and n.batch >= OFFLOAD_MIN_BATCH
            dev[n.name] = offload_to if off else n.weight
    ops = [n for n in nodes if not n.leaf and not n.view_of]
    for order, skip_cpu in ((ops, True), (ops[::-1], True), (ops, False), (ops[::-1], False)):
        cur = ""
        for n in order:
            d = dev.get(n.name)
            if d is not None:
                cur = "" if skip_cpu and d == CPU else d
            elif cur:
                dev[n.name] = cur
    for n in nodes:  # views run where their source is; leafs where their first reader is
        if n.view_of:
            dev[n.name] = dev.get(n.view_of, devices[-1])
    readers: dict[str, str] = {}
    for n in nodes:
        for s in n.srcs:
            readers.setdefault(s, dev.get(n.name, devices[-1]))
    for n in nodes:
        if n.name not in dev:
            dev[n.name] = readers.get(n.name, devices[-1])
    return dev


@dataclass(slots=True)
class _Block:
    offset: int
    size: int


class _Buffer:
    """``ggml_dyn_tallocr``: one device's compute buffer, a single chunk with best-fit free blocks."""

    def __init__(self) -> None:
        self.free: list[_Block] = [_Block(0, 1 << 62)]  # the last block is the open end
        self.peak = 0

    def alloc(self, size: int) -> int:
        best, best_size = -1, 1 << 63
        for i, b in enumerate(self.free[:-1]):  # the smallest block that fits, the end excluded
            if size <= b.size <= best_size:
                best, best_size = i, b.size
        if best < 0:
            best = len(self.free) - 1
        b = self.free[best]
        off = b.offset
        b.offset += size
        b.size -= size
        if b.size == 0:
            del self.free[best]
        self.peak = max(self.peak, off + size)
        return off

    def release(self, off: int, size: int) -> None:
        self.free.append(_Block(off, size))
        self.free.sort(key=lambda b: b.offset)
        merged: list[_Block] = []
        for b in self.free:
            if merged and merged[-1].offset + merged[-1].size == b.offset:
                merged[-1].size += b.size
            else:
                merged.append(b)
        self.free = merged


def buffer_sizes(
    nodes: Sequence[Node], devices: Sequence[str], offload_to: str = "", n_copies: int = 1
) -> dict[str, int]:
    """Each device's compute buffer: rules 1-3 over the graph's nodes (in the graph's order).
    ``n_copies`` > 1 is pipeline parallelism (``ggml_backend_sched_new(..., parallel)``: several
    accelerators, every layer offloaded, no tensor override): every graph input and every split
    input then has that many copies, allocated before the first node and never freed."""
    dev = assign(nodes, devices, offload_to)
    by_name = {n.name: n for n in nodes}
    seq, size, copies = _splits(nodes, dev, by_name)
    bufs = {d: _Buffer() for d in devices}
    at: dict[str, int] = {}
    children: dict[str, int] = {}
    for _, _, srcs in seq:
        for s in srcs:
            children[s] = children.get(s, 0) + 1
    pinned = {n.name for n in nodes if n.pinned}
    leafs = [n for n in nodes if n.leaf]
    if n_copies > 1:  # ggml_backend_sched_split_graph, pass 6 and "add input copies as leafs"
        for n in leafs:
            if n.is_input:
                for _ in range(n_copies - 1):
                    bufs[CPU].alloc(n.nbytes)
                pinned.add(n.name)
        for c in copies:
            at[c] = bufs[dev[c]].alloc(size[c])
            for _ in range(n_copies - 1):
                bufs[dev[c]].alloc(size[c])
            pinned.add(c)
    for n in leafs:
        at[n.name] = bufs[dev[n.name]].alloc(n.nbytes)
        size[n.name] = n.nbytes
    for name, d, srcs in seq:
        node = by_name.get(name)
        if name in at or name.endswith("@dep") or (node is not None and node.view_of):
            pass
        elif node is not None and node.inplace and (src := _reusable(srcs, node, size, children, at=at, pinned=pinned)):
            at[name] = at.pop(src)
        else:
            at[name] = bufs[d].alloc(size[name])
        for s in srcs:
            children[s] -= 1
            if children[s] == 0 and s in at and s not in pinned:
                bufs[dev[s]].release(at.pop(s), size[s])
    return {d: b.peak for d, b in bufs.items()}


def _splits(
    nodes: Sequence[Node], dev: dict[str, str], by_name: dict[str, Node]
) -> tuple[list[tuple[str, str, tuple[str, ...]]], dict[str, int], list[str]]:
    """Rule 2: the nodes in the order the allocator meets them, each split preceded by its input
    copies (and a dependency that keeps each copied tensor until its copy); every tensor's size;
    the copies in order. ``dev`` gains the copies' devices."""
    seq: list[tuple[str, str, tuple[str, ...]]] = []  # (tensor, device, sources)
    size: dict[str, int] = {}
    copies: dict[tuple[str, str], str] = {}
    split_dev, split_has_inputs = "", False
    pending: list[tuple[str, str, tuple[str, ...]]] = []
    body: list[tuple[str, str, tuple[str, ...]]] = []
    for n in nodes:
        if n.leaf:
            continue
        d = dev[n.name]
        wcopy = bool(n.weight and n.weight != d)  # an offloaded op reads a copy of its weight
        if d != split_dev or (wcopy and split_has_inputs):
            seq.extend(pending)
            seq.extend(body)
            pending, body = [], []
            split_dev, split_has_inputs = d, False
        srcs = []
        for s in (*n.srcs, *((f"{n.name}#weight",) if wcopy else ())):
            is_weight = s.endswith("#weight")
            if not is_weight and dev[s] == d:
                srcs.append(s)
                continue
            key = (s, d)
            if key not in copies:
                copies[key] = f"{d}#{s}"
                size[copies[key]] = n.weight_bytes if is_weight else by_name[s].nbytes
                dev[copies[key]] = d
                if not is_weight:
                    pending.append((f"{s}@dep", dev[s], (s,)))  # keeps the source until the copy is made
                pending.append((copies[key], d, ()))
                split_has_inputs = True
            srcs.append(copies[key])
        size[n.name] = 0 if n.view_of else n.nbytes
        body.append((n.name, d, tuple(srcs)))
    seq.extend(pending)
    seq.extend(body)
    return seq, size, list(copies.values())


def _reusable(
    srcs: Sequence[str],
    node: Node,
    size: dict[str, int],
    children: dict[str, int],
    *,
    at: dict[str, int],
    pinned: set[str],
) -> str:
    """``ggml_gallocr_allocate_node``: the first source, in order, whose buffer the node can take
    over: allocated here, not an output, same size, and this node its last reader."""
    for s in srcs:
        if s in at and s not in pinned and children.get(s, 0) == 1 and size.get(s) == node.nbytes:
            return s
    return ""
