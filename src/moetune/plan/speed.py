"""First-order speed model: decode (TG) and prefill (PP) throughput of a placement.

Prediction is split in two so that measurements can correct it. :func:`work` says what each device
does, from the model, the placement and the settings alone: bytes read per token (non-expert
weights, ``k/E`` of its expert tensors, and per token of context its layers' KV cache), attention
FLOPs per token of context, parameters multiplied per token, the threads that compute on it, and
per token the graph splits (backend switches) and RPC hops. :func:`decode_seconds` and
:func:`ubatch_seconds` turn that work into time with the constants of :class:`SpeedConstants`.
The work is stored with every prediction (``Prediction.to_json()["work"]``), so a calibration
refits the constants to measured runs through these same two functions.

Decode, per token: a fixed cost, a cost per split and per RPC hop (plus the wake-up of a sleeping
core when the host computes on one thread, so that no thread of its pool polls while it waits for
the worker's reply), activations crossing RPC links,
and per device its reads: on a GPU at its bandwidth times an efficiency; on CPU cores (the host, or
an RPC worker's CPU backend) the larger, softly, of the bandwidth time and the time the threads need
to dequantize and multiply what they read (so fewer threads cost speed where the cores, not the
memory, are the limit); plus attention over the context. Prefill, per ubatch of ``B`` tokens: a
fixed cost, the splits, and matmul FLOPs on each device at its throughput; on a GPU build, expert
weights left on the CPU are streamed over the host link once per ubatch (llama.cpp offloads batches
of 32+ tokens to the GPU, ik_llama.cpp batches of 32 E/k+; smaller ones the CPU computes), the share
of them a ubatch touches being ``1 - (1 - k/E)^B``, or with measured routing
(an imatrix, :mod:`moetune.model.routing`) what each layer's measured chances give.

Every constant is printed with each prediction and overridable (``--speed K=V``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from moetune.errors import InputError
from moetune.hardware.inventory import Device, Inventory
from moetune.jsonread import mapping, number
from moetune.kinds import DeviceKind, EngineKind
from moetune.model.kv import CACHE_TYPES, KVShape, kv_shape
from moetune.model.profile import ModelProfile, Tensor
from moetune.model.routing import Routing, touched_by
from moetune.plan.ledger import loaded, repack_buffers
from moetune.plan.placement import CPU, Placement, tensor_device
from moetune.plan.repack import in_place
from moetune.plan.settings import Settings

GB = 1e9
MIB = 1 << 20
RPC_WORKER_THREADS = 1  # ggml-rpc-server's CPU backend computes on one thread unless told -t (moetune does not)
SOFT_MAX_P = 4.0  # how sharply the CPU's time follows the larger of its memory and compute limits


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeedConstants:
    # Marked "published": fitted to the table of published measurements shipped with moetune
    # (moetune/plan/priors/published.yaml: 15 rows on 7 rigs, EPYC/Threadripper + one GPU and CPU-only,
    # ik_llama.cpp, DeepSeek-V3/R1, GLM-5.1 and Qwen3-235B; the fit saw 11 rows on 5 rigs, not the
    # references' 3 nor the dual-Xeon row) by calibrate's own fit, from the guesses before it
    # (priors.GUESSES), rounded; `python benchmarks/run.py priors` refits them and reports the
    # leave-one-rig-out error (tests/plan/test_priors.py checks these are the refit). Memory
    # bandwidths there are the theoretical peaks (channels x MT/s x 8), so a hardware file's
    # ram_bw_gbs should be the peak.
    gpu_bw_eff: float = 0.87  # share of a GPU's memory bandwidth a decode step reaches (published; guess 0.75)
    cpu_bw_eff: float = 0.38  # share of peak RAM bandwidth the CPU expert matmuls reach (published; guess 0.55)
    # weight bytes one CPU thread dequantizes and multiplies per second (decode): published; guess 10.
    # Seen only where few threads share many memory channels: one row, another owner's EPYC 9175F
    # (16 threads read ~250 GB/s; without that row the fit keeps ~10); the 24-32-thread rigs are bound
    # by bandwidth
    cpu_core_gbs: float = 30.0
    split_us: float = 25.0  # cost of one backend switch (sync, copy of the activations)
    rpc_hop_us: float = 150.0  # extra cost of a switch to or from an RPC device (network round trip)
    # sampling, graph launch, bookkeeping per token (published; guess 300: the published rows, all
    # with ~110-150 splits, cannot tell it from split_us, which stays at its guess)
    token_overhead_us: float = 400.0
    # a switch to or from an RPC device while the host computes on one thread: the host waits for the
    # reply asleep (no thread of ggml's pool polls), and waking a sleeping core costs (measured on the
    # testbed: cpu-moe on 1 thread, 17 hops a token, ran 1.7x faster beside a spinning process that
    # kept the cores awake)
    rpc_wake_us: float = 150.0
    # attention over the context while decoding, beyond reading the cache: small, latency-bound
    # kernels, far below matmul throughput. With flash attention and an f16 cache (the engine's CPU
    # FA kernel): from the testbed's 654 tok/s at depth 0 and 354 at depth 512 (issue #25), less
    # the cache's bytes, 9 GFLOP/s on 2 cores (an earlier guess: 1.5 per core)
    cpu_ctx_gflops_per_core: float = 4.5
    # without flash attention the CPU runs attention as two matmuls (K.q, then V.softmax) that share each
    # cached row across the query heads of a GQA group and take the softmax in one pass; its FA kernel
    # (ggml-cpu ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk) walks the cache once per
    # query head, with an expf and an F16 accumulate (ggml_vec_mad_f16) per cached token. It pays for
    # it a fixed cost a layer a token, whatever the context (cpu_noflash_layer_us): the matmuls, the
    # mask and softmax and the copies between them are more graph nodes than the one FA node, each a
    # barrier of the thread pool. Measured on this project's EPYC (2 threads, 8 layers): llama-bench
    # -p 0 -n 256 -r 5 -d 0,512, four interleaved rounds: at depth 0 FA on decodes about 900 tok/s,
    # off 700, at depth 512 off is the faster (610 against 550); `moetune hw attention` (three
    # launches a variant, depths 0-2048) fitted 21 us a layer and a 1.28x faster context term, where
    # a fit through one intercept for both had said 1.01x. The built-in pair keeps the AMX Xeon's
    # depth-512 figures of issue #25 (FA off 455 tok/s, on 354, 654 at depth 0) with that fixed
    # cost: 4.8x
    cpu_noflash_ctx_factor: float = 4.8
    cpu_noflash_layer_us: float = 20.0
    # attention over quantized cache rows (q8_0, q4_0): the engine quantizes q once to the K type's
    # vec_dot type and dots int8 blocks (ggml_vec_dot_q8_0_q8_0), and dequantizes V rows to F32
    # (v_to_float + ggml_vec_mad_f32) instead of the F16 accumulate: measured on the testbed at depth
    # 512 with flash attention, a q8_0/q8_0 cache decodes 510 tok/s against f16's 354: less the
    # cache's bytes (17/32 of f16's) and the fixed cost below, attention 8x faster
    cpu_ctx_quant_factor: float = 8.0
    # ...and a fixed cost a layer a token with both K and V quantized, whatever the context: the new
    # token's K and V rows quantized into the cache, q converted to the K type's dot type. Measured
    # on this project's EPYC (`moetune hw attention`, 2 threads, three launches a variant): at depth 0
    # an f16 cache decodes 1184 tok/s, a q8_0 one 910, 34 us a layer of the probe's 8
    cpu_ctx_quant_layer_us: float = 30.0
    # the same three while prefilling: a ubatch's queries against the cache before it and themselves
    # (batched, each cached row read once a ubatch). Guesses: no machine's figure is built in, as
    # they differ by CPU (this project's EPYC, `moetune hw attention`: 32 GFLOP/s a core with flash
    # attention, 0.79x without, 0.2x over q8_0 rows); the hardware file's cpu.speed gives them
    cpu_pp_ctx_gflops_per_core: float = 20.0
    cpu_pp_noflash_ctx_factor: float = 1.0
    cpu_pp_ctx_quant_factor: float = 1.0
    # CPU weight repacking (mainline's CPU_REPACK/AMX extra buffers, ik's -rtr): the weights in the
    # interleaved layout the GEMV/GEMM kernels read several rows per block of quantized activations
    # from (ggml-cpu repack.cpp): decode and prefill matmuls on the CPU are this much faster;
    # measured with llama-bench on the testbed's F16 model, tg 591 tok/s with --repack 0, 681 with 1
    # (an AMX Xeon: its AMX buffer takes F16). It applies to the share of a device's bytes the engine
    # repacks (DeviceWork.repacked_share): on the EPYC's engine-axes grid, where mainline repacks no
    # q8_0 weight, TG with and without --repack differed by -2% median (noise)
    cpu_repack_gain: float = 1.15
    gpu_ctx_tflops: float = 20.0
    # effective matmul throughput of a GPU without a declared figure (prefill; published: the
    # attention of the rows' 512-token ubatches, guess 80)
    gpu_tflops: float = 160.0
    cpu_gflops_per_core: float = 40.0  # effective matmul throughput per CPU thread (prefill), mainline (a guess)
    # the same with ik_llama.cpp's CPU kernels (iqk_mul_mat): published, on Zen 4/5 with repacked
    # weights (the rows' 512-token prefill runs on the CPU: ik offloads from 32 E/k tokens)
    ik_cpu_gflops_per_core: float = 230.0
    ubatch_overhead_us: float = 2000.0  # fixed cost of one ubatch of prefill (graph build, scheduling; refit 1971)
    offload_min_batch: int = 32  # llama.cpp moves CPU-resident matmuls to the GPU for batches this big

    def with_overrides(self, pairs: dict[str, str]) -> SpeedConstants:
        names = {f.name for f in fields(self)}
        kw: dict[str, float] = {}
        for k, v in pairs.items():
            if k not in names:
                raise InputError(f"--speed {k}: unknown constant (known: {', '.join(sorted(names))})")
            try:
                kw[k] = int(v) if k == "offload_min_batch" else float(v)
            except ValueError:
                raise InputError(f"--speed {k}={v}: not a number") from None
            if kw[k] <= 0:
                raise InputError(f"--speed {k}={v}: must be positive")
        return SpeedConstants.from_json({**asdict(self), **kw})

    @classmethod
    def from_json(cls, doc: Mapping[str, object] | None) -> SpeedConstants:
        """Constants as stored (a plan, a calibration); names this version does not know are ignored,
        and so are values that are not numbers."""
        doc = doc or {}
        given = {f.name: v for f in fields(cls) if (v := number(doc.get(f.name))) is not None}
        batch = given.pop("offload_min_batch", None)  # the one whole number
        return cls(**given, offload_min_batch=cls().offload_min_batch if batch is None else int(batch))


def base_constants(hw: Inventory, k: SpeedConstants | None = None) -> SpeedConstants:
    """The constants a plan on ``hw`` starts from: ``k`` (the built-in ones) with what the hardware
    file measured for its first node's CPU (``cpu.speed``, `moetune hw attention`)."""
    k = k or SpeedConstants()
    return SpeedConstants.from_json({**asdict(k), **dict(hw.local.cpu_speed)}) if hw.local.cpu_speed else k


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceWork:
    """What one device does: per token of decode, per ubatch of prefill."""

    device: str
    cpu: bool  # computed by CPU cores: the host, or an RPC worker's CPU backend
    bw_gbs: float  # its memory bandwidth (the hardware file's figure: the physical limit)
    threads: int = 0  # CPU threads computing on it (0 for a GPU)
    cores: int = 0  # the cores of the CPU computing on it (0 for a GPU)
    tflops: float | None = None  # an accelerator's declared matmul throughput
    read_bytes: float = 0.0  # weights read per token (expert tensors at k/E)
    kv_bytes_per_ctx: float = 0.0  # KV cache bytes read per token, per token of context
    ctx_flop_per_ctx: float = 0.0  # attention FLOPs per token, per token of context
    active_params: float = 0.0  # weight parameters multiplied per token
    held_expert_bytes: float = 0.0  # expert tensors it holds (what a GPU streams from the host per ubatch)
    # with measured routing (`--routing`): the share of those bytes a batch of 2^i tokens touches,
    # i = 0..16; empty: every expert alike (``touched_share``)
    touched: tuple[float, ...] = ()
    batch_threads: int = 0  # threads for prefill (the plan's --threads-batch); 0: the same as ``threads``
    # sliding-window layers: KV bytes and attention FLOPs per token of context, up to ``window`` tokens
    kv_bytes_windowed: float = 0.0
    ctx_flop_windowed: float = 0.0
    window: int = 0
    flash_attn: bool = True  # attention by the engine's flash-attention kernel (stored works before: on)
    attn_layers: int = 0  # layers whose attention it computes (stored works before: 0, no per-layer cost)
    ctx_quant_share: float = 0.0  # the share of its attention FLOPs over quantized cache rows (K, V)
    # the share of the weight bytes it reads a token that run repacked (the host's CPU backend, where
    # the plan repacks: mainline's repack buffers take only the types with an interleaved kernel on
    # this CPU, plan.repack; ik's -rtr repacks in place)
    repacked_share: float = 0.0

    @property
    def repacked(self) -> bool:
        return self.repacked_share > 0

    def repack_scale(self, k: SpeedConstants) -> float:
        """What repacking leaves of the time its weights' matmuls take: the repacked share runs
        ``cpu_repack_gain`` times faster, the rest as it was."""
        s = min(1.0, max(0.0, self.repacked_share))
        return 1.0 - s + s / k.cpu_repack_gain

    @property
    def prefill_threads(self) -> int:
        return max(1, self.batch_threads or self.threads)

    def kv_read(self, depth: float) -> tuple[float, float]:
        """KV bytes read and attention FLOPs per token at context depth ``depth``: every cached token
        of the full-attention layers, at most a window of the sliding-window ones."""
        w = min(depth, self.window)
        return (
            depth * self.kv_bytes_per_ctx + w * self.kv_bytes_windowed,
            depth * self.ctx_flop_per_ctx + w * self.ctx_flop_windowed,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """Everything a placement asks of the hardware, before any constant turns it into time."""

    devices: tuple[DeviceWork, ...]
    graph_splits: int
    rpc_hops: int
    rpc_activation_s: float = 0.0  # activations crossing RPC links per token (at the links' bandwidth)
    ubatch: int = 512
    expert_share: float = 1.0  # k/E: the share of a layer's experts one token uses
    offload: bool = False  # a GPU build: CPU experts' prefill matmuls go to the first GPU, over its link
    offload_tflops: float | None = None  # that GPU's declared throughput
    offload_link_gbs: float = 25.0
    host_threads: int = 0  # threads of the host's CPU backend (0: not recorded, by an earlier moetune)
    engine: str = EngineKind.MAINLINE  # the engine that runs it (its prefill offload rule and CPU kernels)

    @property
    def offload_batch_scale(self) -> float:
        """How much larger than ``offload_min_batch`` a batch must be for the engine to offload the
        CPU-resident expert matmuls: ik_llama.cpp offloads one only when each expert gets that many
        tokens on average, batch * k >= min_batch * E (ggml-cuda.cu, ggml_backend_cuda_offload_op;
        DeepSeek-V3: 1024 tokens), mainline from ``offload_min_batch`` tokens whatever the experts."""
        return 1.0 / self.expert_share if self.engine == EngineKind.IK and 0 < self.expert_share < 1 else 1.0

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "devices": [asdict(d) for d in self.devices]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Work:
        names = {f.name for f in fields(DeviceWork)}

        def device(d: dict[str, Any]) -> DeviceWork:
            if "repacked" in d and "repacked_share" not in d:  # stored before the share: all or nothing
                d = {**d, "repacked_share": 1.0 if d["repacked"] else 0.0}
            return DeviceWork(**{k: v for k, v in d.items() if k in names})

        devs = tuple(replace(dw, touched=tuple(dw.touched)) for dw in map(device, doc["devices"]))
        return cls(**{**{k: v for k, v in doc.items() if k in {f.name for f in fields(cls)}}, "devices": devs})


def _soft_max(a: float, b: float) -> float:
    return float((a**SOFT_MAX_P + b**SOFT_MAX_P) ** (1 / SOFT_MAX_P))


def cpu_ctx_gflops(d: DeviceWork, k: SpeedConstants) -> float:
    """Attention FLOP/s per CPU thread over the cache: the FA kernel's rate on an f16 cache, times
    the non-FA path's factor without flash attention, the share over quantized rows at the quantized
    rate (a harmonic mean: each share takes its own time)."""
    rate = k.cpu_ctx_gflops_per_core * (1.0 if d.flash_attn else k.cpu_noflash_ctx_factor) * 1e9
    q = min(1.0, max(0.0, d.ctx_quant_share))
    return rate / ((1.0 - q) + q / k.cpu_ctx_quant_factor)


def cpu_layer_us(d: DeviceWork, k: SpeedConstants) -> float:
    """The attention's fixed cost a layer a decoded token on the CPU, beyond the FA kernel's with an
    f16 cache: the path without flash attention's extra graph nodes, the quantized cache's
    conversions (on the share of the attention over quantized rows)."""
    q = min(1.0, max(0.0, d.ctx_quant_share))
    return (0.0 if d.flash_attn else k.cpu_noflash_layer_us) + q * k.cpu_ctx_quant_layer_us


def cpu_pp_ctx_gflops(d: DeviceWork, k: SpeedConstants) -> float:
    """Attention FLOP/s per CPU thread while prefilling: a ubatch's queries against the cache (and
    themselves), the same three variants as decode with their own rates (batched, the cache's rows
    are read once per ubatch, not once per token)."""
    rate = k.cpu_pp_ctx_gflops_per_core * (1.0 if d.flash_attn else k.cpu_pp_noflash_ctx_factor) * 1e9
    q = min(1.0, max(0.0, d.ctx_quant_share))
    return rate / ((1.0 - q) + q / k.cpu_pp_ctx_quant_factor)


def device_decode_seconds(d: DeviceWork, depth: float, k: SpeedConstants) -> float:
    kv, flop = d.kv_read(depth)
    read = d.read_bytes + kv
    if d.cpu:
        threads = max(1, d.threads)
        # repacked weights stream as if they were that much fewer bytes (both limits: measured on a
        # model that fits neither; the engine's interleaved blocks feed its SIMD rows without gathers)
        read = d.read_bytes * d.repack_scale(k) + kv
        t = _soft_max(read / (d.bw_gbs * GB * k.cpu_bw_eff), read / (threads * k.cpu_core_gbs * GB))
        fixed = d.attn_layers * cpu_layer_us(d, k) * 1e-6
        return t + fixed + flop / (threads * cpu_ctx_gflops(d, k))
    return read / (d.bw_gbs * GB * k.gpu_bw_eff) + flop / (k.gpu_ctx_tflops * 1e12)


def decode_context(depth: int, prompt_tokens: int = 0, generated: int = 1) -> float:
    """The context the tokens of a measured TG see on average: ``depth`` cached tokens, the prompt
    processed on top of them, and before each generated token the ones generated before it. A
    token's decode time grows linearly with its context, so TG over ``generated`` tokens is the TG
    at this mean (a bench at depth 512 with a 256-token prompt and 128 generated tokens decodes at
    831.5 on average, not at 512; llama-bench's tg128 @ d512 at 575.5)."""
    return depth + max(0, prompt_tokens) + (max(1, generated) - 1) / 2


def hop_us(w: Work, k: SpeedConstants) -> float:
    """The cost of one switch to or from an RPC device: a round trip, and where no thread of the
    host's pool polls (one thread), the wake-up of a sleeping core."""
    return k.rpc_hop_us + (k.rpc_wake_us if w.host_threads == 1 else 0.0)


def switch_seconds(w: Work, k: SpeedConstants) -> float:
    """The graph's backend switches, once per evaluation (a token of decode, a ubatch of prefill)."""
    return (w.graph_splits * k.split_us + w.rpc_hops * hop_us(w, k)) * 1e-6


def decode_seconds(w: Work, depth: float, k: SpeedConstants) -> float:
    """Seconds per generated token at context depth ``depth`` (a mean over tokens: :func:`decode_context`)."""
    t = k.token_overhead_us * 1e-6 + switch_seconds(w, k) + w.rpc_activation_s
    return t + sum(device_decode_seconds(d, depth, k) for d in w.devices)


def touched_share(expert_share: float, tokens: int) -> float:
    """The share of a layer's experts that a batch of ``tokens`` tokens uses at least once, each token
    choosing ``k`` of ``E`` at random: ``1 - (1 - k/E)^tokens``."""
    return touched_by((expert_share,), tokens)


TOUCH_POINTS = tuple(2**i for i in range(17))  # batch sizes a device's measured-routing table is kept at


def held_touched(d: DeviceWork, expert_share: float, tokens: int) -> float:
    """The share of the expert bytes ``d`` holds that a batch of ``tokens`` tokens touches: from
    its measured-routing table (interpolated in log2 of the batch), else every expert alike."""
    if not d.touched:
        return touched_share(expert_share, tokens)
    x = min(math.log2(max(1, tokens)), len(d.touched) - 1.0)
    i = min(int(x), len(d.touched) - 2)
    return d.touched[i] + (d.touched[i + 1] - d.touched[i]) * (x - i)


def cpu_gflops(w: Work, k: SpeedConstants) -> float:
    """Prefill matmul GFLOP/s per CPU thread: ik_llama.cpp's own CPU kernels (iqk_mul_mat) or
    mainline's."""
    return k.ik_cpu_gflops_per_core if w.engine == EngineKind.IK else k.cpu_gflops_per_core


def ubatch_seconds(w: Work, tokens: int, k: SpeedConstants, depth: int = 0) -> float:
    """Seconds to prefill one ubatch of ``tokens`` tokens on top of ``depth`` cached ones."""
    t = k.ubatch_overhead_us * 1e-6 + switch_seconds(w, k)
    for d in w.devices:
        flop = 2 * d.active_params * tokens
        # attention: each token of the ubatch over the cache and the ubatch's tokens before it
        attn = tokens * d.kv_read(depth + tokens // 2)[1]
        if d.cpu:
            t += attn / (d.prefill_threads * cpu_pp_ctx_gflops(d, k))
        else:
            t += attn / ((d.tflops or k.gpu_tflops) * 1e12)
        if d.device == CPU and w.offload and tokens >= k.offload_min_batch * w.offload_batch_scale:
            # CPU-resident expert matmuls run on the GPU: the weights they touch cross the host link
            t += d.held_expert_bytes * held_touched(d, w.expert_share, tokens) / (w.offload_link_gbs * GB)
            t += flop / ((w.offload_tflops or k.gpu_tflops) * 1e12)
        elif d.cpu:
            t += flop * d.repack_scale(k) / (d.prefill_threads * cpu_gflops(w, k) * 1e9)
            # each ubatch reads the weights it multiplies once more from RAM (the experts its tokens
            # touch): a smaller -ub reads them more often per prompt token
            if d.bw_gbs > 0:
                t += (
                    d.read_bytes
                    - d.held_expert_bytes * w.expert_share
                    + d.held_expert_bytes * held_touched(d, w.expert_share, tokens)
                ) / (d.bw_gbs * GB * k.cpu_bw_eff)
        else:
            t += flop / ((d.tflops or k.gpu_tflops) * 1e12)
    return t


def prefill_tok_s(w: Work, k: SpeedConstants, prompt_tokens: int | None = None, depth: int = 0) -> float:
    """Prefill throughput: a prompt of ``prompt_tokens`` on top of ``depth`` cached tokens goes in
    ubatches of the plan's size (the last one partial), each over the context before it; without a
    length, one full ubatch."""
    n = prompt_tokens or w.ubatch
    full, rest = divmod(n, w.ubatch)
    t = sum(ubatch_seconds(w, w.ubatch, k, depth + i * w.ubatch) for i in range(full))
    t += ubatch_seconds(w, rest, k, depth + full * w.ubatch) if rest else 0.0
    return n / t if t > 0 else 0.0


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    device: str
    read_mib_per_token: float
    decode_ms: float
    bw_gbs: float = 0.0  # the device's memory bandwidth in the hardware file (the physical limit)


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    tg_tok_s: float
    pp_tok_s: float
    work: Work
    constants: SpeedConstants
    depth: int = 0  # the context the prompt (PP) is processed on top of
    tg_depth: float | None = None  # the mean context of the TG (None: ``depth``)
    per_device: tuple[DeviceLoad, ...] = field(default=())

    @property
    def graph_splits(self) -> int:
        return self.work.graph_splits

    @property
    def rpc_hops(self) -> int:
        return self.work.rpc_hops

    def to_json(self) -> dict[str, object]:
        return {
            "tg_tok_s": round(self.tg_tok_s, 3),
            "pp_tok_s": round(self.pp_tok_s, 3),
            "ms_per_token": round(1000.0 / self.tg_tok_s, 5),
            "graph_splits": self.graph_splits,
            "rpc_hops": self.rpc_hops,
            "depth": self.depth,
            "tg_depth": self.depth if self.tg_depth is None else round(self.tg_depth, 2),
            "per_device": [asdict(d) for d in self.per_device],
            "constants": asdict(self.constants),
            "work": self.work.to_json(),
        }


def graph_splits(p: ModelProfile, pl: Placement, experts: dict[str, str]) -> tuple[int, list[tuple[str, str]]]:
    """Backend switches per token: walk the ops of each layer in order (attention on the layer's
    device, then its expert tensors, then back) and count device changes."""
    seq: list[str] = [CPU]  # input embeddings
    by_layer: dict[int, list[str]] = {}
    for name, dev in experts.items():
        layer = int(name.split(".", 2)[1])
        by_layer.setdefault(layer, []).append(dev)
    for il in range(p.n_layer):
        seq.append(pl.layer_device[il])
        devs = sorted(set(by_layer.get(il, [])))
        seq.extend(d for d in devs if d != pl.layer_device[il])
        seq.append(pl.layer_device[il])  # shared expert, residual
    seq.append(pl.output_device)
    hops = [(a, b) for a, b in itertools.pairwise(seq) if a != b]
    return len(hops) + 1, hops


QUANT_CACHE = tuple(t for t in CACHE_TYPES if t not in ("f16", "bf16", "f32"))  # the CPU attends to them by int8 dots


def _share(part: float, whole: float) -> float:
    return round(part / whole, 6) if whole > 0 else 0.0


def _cpu_backed(hw: Inventory, dev: Device) -> bool:
    """An RPC device that is a worker's CPU backend (loopback test rigs, CPU-only nodes)."""
    if dev.kind != DeviceKind.RPC:
        return dev.kind == DeviceKind.CPU
    node = next((n for n in hw.nodes if n.name == dev.node), None)
    return node is not None and any(d.kind == DeviceKind.CPU for d in node.devices)


def _touched_table(by_layer: dict[int, float], routing: Routing, expert_share: float) -> tuple[float, ...]:
    """A device's share of held expert bytes touched at each of :data:`TOUCH_POINTS`, its layers
    weighted by their bytes (a layer the routing file lacks: every expert alike)."""
    total = sum(by_layer.values())
    if total <= 0:
        return ()
    out = []
    for b in TOUCH_POINTS:
        shares = ((routing.touched(layer, b), n) for layer, n in by_layer.items())
        out.append(sum(n * (touched_share(expert_share, b) if s is None else s) for s, n in shares) / total)
    return tuple(round(x, 6) for x in out)


def _repacked_names(cpu: list[Tensor], hw: Inventory, s: Settings) -> frozenset[str] | None:
    """The host CPU's tensors that run repacked: those mainline moves into its repack buffers (the
    ledger's own choice, for this CPU's extensions), every one with ik's in-place ``-rtr`` (None)."""
    if in_place(s.engine, s.repacks):
        return None
    return repack_buffers(cpu, hw, s).names


def work(p: ModelProfile, hw: Inventory, pl: Placement, s: Settings, *, routing: Routing | None = None) -> Work:
    """What the placement asks of each device (no constants involved); with measured ``routing``,
    the share of each device's experts a batch touches."""
    experts = pl.experts()
    frac = p.n_expert_used / p.n_expert if p.n_expert else 1.0
    read: dict[str, float] = {}
    held: dict[str, float] = {}
    held_by_layer: dict[str, dict[int, float]] = {}
    active: dict[str, float] = {}
    repacked_read: dict[str, float] = {}
    tensors = [(t, tensor_device(t, pl, experts)) for t in loaded(p, s)]
    packed = _repacked_names([t for t, d in tensors if d == CPU], hw, s)
    for t, d in tensors:
        if t.kind == "token_embd":
            continue  # one row per token
        f = frac if t.is_expert else 1.0
        read[d] = read.get(d, 0.0) + t.nbytes * f
        if d == CPU and (packed is None or t.name in packed):
            repacked_read[d] = repacked_read.get(d, 0.0) + t.nbytes * f
        held[d] = held.get(d, 0.0) + (t.nbytes if t.is_expert else 0.0)
        if t.is_expert and t.layer is not None:
            layers = held_by_layer.setdefault(d, {})
            layers[t.layer] = layers.get(t.layer, 0.0) + t.nbytes
        n = 1
        for x in t.shape:
            n *= x
        active[d] = active.get(d, 0.0) + n * f
    kv_per_ctx: dict[str, float] = {}
    ctx_flop: dict[str, float] = {}
    kv: KVShape = kv_shape(p, s.engine)
    heads = p.hp_int("attention.head_count", 1) or 1
    q_per_kv = heads / max(1, p.hp_int("attention.head_count_kv", heads) or heads)
    kv_win: dict[str, float] = {}
    flop_win: dict[str, float] = {}
    quant_flop: dict[str, float] = {}
    attn_layers: dict[str, int] = {}
    for lk in kv.layers:
        d = pl.layer_device[lk.layer]
        attn_layers[d] = attn_layers.get(d, 0) + 1
        # a sliding-window layer reads at most a window of its cache (with --swa-full the attention
        # runs over a cache of the whole context, the masked cells included)
        windowed = lk.swa and not s.swa_full
        kv_d, flop_d = (kv_win, flop_win) if windowed else (kv_per_ctx, ctx_flop)
        kv_d[d] = kv_d.get(d, 0.0) + KVShape.layer_bytes_per_token(lk, s.ctk, s.ctv)
        # q.k and p.v over every cached row, for every query head sharing it
        k_flop = 2 * q_per_kv * sum(lk.k_rows)
        v_flop = 2 * q_per_kv * (sum(lk.v_rows) or sum(lk.k_rows))
        flop_d[d] = flop_d.get(d, 0.0) + k_flop + v_flop
        quant_flop[d] = (
            quant_flop.get(d, 0.0)
            + (k_flop if s.ctk in QUANT_CACHE else 0.0)
            + (v_flop if s.ctv in QUANT_CACHE else 0.0)
        )
    devs = {d.name: d for d in hw.devices()}
    local_threads = min(s.threads or hw.local.cores, hw.local.cores)
    local_batch_threads = min(s.threads_batch, hw.local.cores) if s.threads_batch else 0
    out = []
    for name in sorted(set(read) | set(ctx_flop) | set(flop_win)):
        dev = devs.get(name) or hw.cpu()
        cpu = _cpu_backed(hw, dev)
        node = next((n for n in hw.nodes if n.name == dev.node), hw.local)
        threads = (local_threads if dev.kind == DeviceKind.CPU else RPC_WORKER_THREADS) if cpu else 0
        touched = _touched_table(held_by_layer.get(name, {}), routing, frac) if routing is not None else ()
        out.append(
            DeviceWork(
                device=name,
                cpu=cpu,
                bw_gbs=dev.bw_gbs,
                threads=threads,
                cores=node.cores if cpu else 0,
                tflops=dev.tflops,
                read_bytes=read.get(name, 0.0),
                kv_bytes_per_ctx=kv_per_ctx.get(name, 0.0),
                ctx_flop_per_ctx=ctx_flop.get(name, 0.0),
                active_params=active.get(name, 0.0),
                held_expert_bytes=held.get(name, 0.0),
                touched=touched,
                batch_threads=local_batch_threads if cpu and dev.kind == DeviceKind.CPU else 0,
                kv_bytes_windowed=kv_win.get(name, 0.0),
                ctx_flop_windowed=flop_win.get(name, 0.0),
                window=kv.n_swa if name in flop_win else 0,
                flash_attn=s.flash_attn,
                attn_layers=attn_layers.get(name, 0),
                ctx_quant_share=_share(quant_flop.get(name, 0.0), ctx_flop.get(name, 0.0) + flop_win.get(name, 0.0)),
                repacked_share=_share(repacked_read.get(name, 0.0), read.get(name, 0.0))
                if dev.kind == DeviceKind.CPU
                else 0.0,
            )
        )
    n_splits, hops = graph_splits(p, pl, experts)
    kinds = {name: d.kind for name, d in devs.items()}
    rpc_hops = sum(1 for src, dst in hops if kinds.get(src) == DeviceKind.RPC or kinds.get(dst) == DeviceKind.RPC)
    act = sum(
        p.n_embd * 4 / (devs[name].link_gbs * GB)
        for src, dst in hops
        for name in (src, dst)
        if kinds.get(name) == DeviceKind.RPC
    )
    gpus = [d for d in hw.accelerators() if d.kind == DeviceKind.GPU]
    return Work(
        devices=tuple(out),
        graph_splits=n_splits,
        rpc_hops=rpc_hops,
        rpc_activation_s=act,
        ubatch=min(s.ubatch, s.batch),
        expert_share=frac,
        offload=bool(gpus),
        offload_tflops=gpus[0].tflops if gpus else None,
        offload_link_gbs=gpus[0].link_gbs if gpus else 25.0,
        host_threads=local_threads,
        engine=s.engine,
    )


def predict(
    p: ModelProfile,
    hw: Inventory,
    pl: Placement,
    s: Settings,
    *,
    k: SpeedConstants | None = None,
    depth: int = 0,
    routing: Routing | None = None,
) -> Prediction:
    k = k or SpeedConstants()
    w = work(p, hw, pl, s, routing=routing)
    return from_work(w, k, depth)


def from_work(
    w: Work, k: SpeedConstants, depth: int = 0, prompt_tokens: int | None = None, *, tg_depth: float | None = None
) -> Prediction:
    """TG at ``tg_depth`` (the mean context of the generated tokens; default ``depth``), PP of
    ``prompt_tokens`` on top of ``depth`` cached tokens."""
    at = depth if tg_depth is None else tg_depth
    loads = tuple(
        DeviceLoad(
            d.device,
            round((d.read_bytes + d.kv_read(at)[0]) / MIB, 3),
            round(device_decode_seconds(d, at, k) * 1e3, 4),
            d.bw_gbs,
        )
        for d in w.devices
    )
    pp = prefill_tok_s(w, k, prompt_tokens, depth)
    return Prediction(
        tg_tok_s=1.0 / decode_seconds(w, at, k),
        pp_tok_s=pp,
        work=w,
        constants=k,
        depth=depth,
        tg_depth=tg_depth,
        per_device=loads,
    )


def at_depth(
    predicted: Mapping[str, object], depth: int, prompt_tokens: int | None = None, tg_depth: float | None = None
) -> dict[str, Any] | None:
    """A stored prediction (``Prediction.to_json()``) for one workload: PP for a prompt of
    ``prompt_tokens`` (the plan's ubatch when not known) on top of ``depth`` cached tokens, TG at
    the mean context ``tg_depth`` of its generated tokens (:func:`decode_context`; None: at
    ``depth``), with the constants it was made with. None for a prediction stored without its work
    (by an earlier moetune)."""
    work = predicted.get("work")
    if not isinstance(work, dict):
        return None
    k = SpeedConstants.from_json(mapping(predicted.get("constants")))
    return from_work(Work.from_json(work), k, depth, prompt_tokens, tg_depth=tg_depth).to_json()
