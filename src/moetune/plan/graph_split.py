"""ik_llama.cpp's graph split (``-sm graph``): every offloaded layer divided across the GPUs.

In layer split each layer lives on one device. In graph split (ik_llama.cpp 0.1.5,
``src/llama-load-tensors.cpp``, after the tensors are created) each layer whose tensors sit in a
GPU's buffer is cut across all the GPUs, by the ``-ts`` shares: attention Q/K/V by heads and its
output by rows, the dense and shared FFN, and the routed experts along their FFN width (each GPU
gets every expert's slice), the recurrent layers' projections likewise; norms, routers and a few
biases are copied whole to every GPU (``prepare_split_tensors`` with ``split_dim = -1``). The parts
live in one ``CUDA_Split`` buffer (the engine logs its total over the GPUs). Tensors sent elsewhere
by ``-ot`` (experts on the CPU) are not split, nor are CPU layers, the token embedding and, in the
architectures here, the output. The KV cache is divided with the heads (``split_kq``/``split_vo``)
and the recurrent state with the layer's projections.

Estimated, not exact: ik rounds each cut to a granularity (a head, a quant block, 16 FFN rows) and
nudges the next cut toward the GPU with less memory used so far, so each GPU's part is within a
block or a head of its share. Only architectures ik splits (``is_model_split_supported``) are
planned; for the others ik falls back to layer split with a warning, and moetune refuses instead.
Pure functions.
"""

from __future__ import annotations

from moetune.errors import InputError
from moetune.hardware.inventory import Inventory
from moetune.kinds import DeviceKind
from moetune.model.profile import ModelProfile, Tensor
from moetune.plan.settings import Settings

# ik_llama.cpp 0.1.5 ``is_model_split_supported``, by GGUF architecture name (qwen3next is commented
# out there; deepseek2 and glm-dsa, the MLA models, are absent)
GRAPH_SPLIT_ARCHS = frozenset(
    {
        "llama",
        "qwen3moe",
        "glm4moe",
        "mistral3",
        "command-r",
        "cohere2",
        "mimo2",
        "qwen3",
        "qwen3vl",
        "hunyuan-moe",
        "gpt-oss",
        "ernie4_5-moe",
        "minimax-m2",
        "seed_oss",
        "step35",
        "qwen35",
        "qwen35moe",
        "gemma4",
    }
)
# tensors every GPU gets whole: norms, routers and their biases, the attention output's bias and the
# routed down projection's bias
_MIRRORED_KINDS = frozenset({"ffn_gate_inp", "ffn_gate_inp_shexp", "exp_probs_b"})
_MIRRORED_BIASES = frozenset({"attn_output", "ffn_down_exps"})


def check(p: ModelProfile, hw: Inventory, s: Settings) -> None:
    """InputError where ik_llama.cpp would not split this model on this hardware."""
    if s.split_mode != "graph":
        return
    if p.arch not in GRAPH_SPLIT_ARCHS:
        raise InputError(
            f"--split-mode graph: ik_llama.cpp does not split {p.arch} (it logs \"Split mode 'graph' is "
            'not supported for this model" and falls back to layer)',
            hint="leave --split-mode at layer and place the experts with --strategy; `moetune doctor` "
            "reports the fallback in a log as split_mode_fallback",
        )
    gpus = [d for d in hw.local.devices if d.kind == DeviceKind.GPU]
    if len(gpus) < 2:
        raise InputError(
            f"--split-mode graph needs two or more GPUs on this machine; the hardware has {len(gpus)}",
            hint="ik_llama.cpp refuses it (\"not possible to use split mode 'graph' with less than 2 "
            'devices"): leave --split-mode at layer',
        )
    groups = p.hp_int("ssm.group_count") if p.is_hybrid_recurrent else 0
    thin = [g for g, f in shares(hw).items() if groups and f * groups <= 0.5]
    if thin:
        raise InputError(
            f"--split-mode graph: ik_llama.cpp divides the delta-net layers by their {groups} key heads, "
            f"and {', '.join(thin)}'s share would get none (ik aborts: \"a single GPU participating in "
            'the delta-net tensor split")',
            hint="plan layer split, or graph split over GPUs of more equal memory",
        )
    if any(d.kind == DeviceKind.RPC for d in hw.accelerators()):
        raise InputError(
            "--split-mode graph divides layers across the local GPUs (a CUDA_Split buffer); the hardware "
            "has RPC devices too",
            hint="plan graph split for the local GPUs alone, or layer split",
        )


def percents(hw: Inventory) -> tuple[int, ...]:
    """``-ts`` for graph split: each local GPU's usable memory as a whole percentage of theirs."""
    gpus = [d for d in hw.local.devices if d.kind == DeviceKind.GPU]
    total = sum(d.usable_mib for d in gpus)
    return tuple(max(1, round(100 * d.usable_mib / total)) for d in gpus) if total > 0 else ()


def shares(hw: Inventory) -> dict[str, float]:
    """Each local GPU's share of a split layer, as ``percents`` (the rendered ``-ts``) says."""
    gpus = [d.name for d in hw.local.devices if d.kind == DeviceKind.GPU]
    pct = percents(hw)
    return {g: x / sum(pct) for g, x in zip(gpus, pct, strict=True)}


def mirrored(t: Tensor) -> bool:
    """A tensor every GPU holds whole rather than a part of."""
    if "norm" in t.kind or t.kind in _MIRRORED_KINDS:
        return True
    return t.name.endswith(".bias") and t.kind in _MIRRORED_BIASES


def parts(t: Tensor, share: dict[str, float]) -> dict[str, float]:
    """Bytes of ``t`` on each GPU under graph split."""
    if mirrored(t):
        return {g: float(t.nbytes) for g in share}
    return {g: t.nbytes * f for g, f in share.items()}


def is_split(t: Tensor, device: str, layer_device: tuple[str, ...], n_layer: int, *, share: dict[str, float]) -> bool:
    """Whether graph split divides ``t`` (on ``device`` under the placement): a trunk layer's tensor
    left on its layer's GPU."""
    return (
        bool(share)
        and t.layer is not None
        and t.layer < n_layer
        and device in share
        and device == layer_device[t.layer]
    )
