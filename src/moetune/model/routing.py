"""Measured routing: how often each expert of each MoE layer is chosen, from an importance-matrix
file (`llama-imatrix ... -o imatrix.gguf`).

An imatrix GGUF (``general.type = imatrix``) holds, for every weight the run multiplied, the
number of rows it multiplied (``<weight>.counts``, F32); for an expert tensor one count per expert:
how many (token, chosen expert) pairs went to it. From the counts of a layer's ``ffn_up_exps`` (or
gate, gate_up, down: one routing per layer) each expert's chance of being chosen by one token is
``count / tokens`` (the chances sum to k). That is what prefill needs: the share of a layer's
experts a batch of B tokens touches is ``mean over experts of 1 - (1 - p_e)^B``, which is
``1 - (1 - k/E)^B`` when every expert is alike and less when routing concentrates. Decode reads k
experts a token whatever they are, so routing does not move TG.

The legacy ``.dat`` format keeps no per-expert counts (values are scaled by them and the counts
dropped): it is refused with the way to make a GGUF one.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moetune.errors import InputError
from moetune.model.gguf_read import read_gguf
from moetune.model.profile import EXPERT_PARTS

GGUF_MAGIC = b"GGUF"
_COUNTS = re.compile(rf"^blk\.(\d+)\.ffn_({'|'.join(EXPERT_PARTS)})_exps\.weight\.counts$")
_PREFERRED = ("up", "gate_up", "gate", "down")  # the same routing; the first found stands for its layer
MAKE_ONE = "make one with `llama-imatrix -m MODEL.gguf -f TEXT.txt -o imatrix.gguf` (llama.cpp's, GGUF output)"


@dataclass(frozen=True, slots=True)
class Routing:
    source: str
    layers: dict[int, tuple[float, ...]]  # MoE layer -> each expert's chance of being chosen by one token
    tokens: int  # tokens the counts came from (the largest layer's)

    def touched(self, layer: int, tokens: int) -> float | None:
        """The share of ``layer``'s experts a batch of ``tokens`` tokens touches; None for a layer
        the file has no counts of."""
        p = self.layers.get(layer)
        return None if p is None else _touched_cached(p, tokens)

    def to_json(self) -> dict[str, object]:
        """What a plan says of it: the file, how many tokens, how concentrated (the share of a
        layer's experts that 64 tokens touch, against what uniform routing would touch)."""
        n = len(next(iter(self.layers.values()), ()))
        k = sum(next(iter(self.layers.values()), ()))
        uniform = 1 - (1 - k / n) ** 64 if n else None
        per_layer = [touched_by(p, 64) for p in self.layers.values()]
        return {
            "source": self.source,
            "tokens": self.tokens,
            "layers": len(self.layers),
            "touched_at_64_tokens": round(sum(per_layer) / len(per_layer), 4) if per_layer else None,
            "uniform_at_64_tokens": None if uniform is None else round(uniform, 4),
        }


def touched_by(chances: Sequence[float], tokens: int) -> float:
    """The expected share of experts a batch of ``tokens`` tokens chooses at least once, each
    expert chosen by a token with its own chance (tokens independent)."""
    if not chances:
        return 0.0
    b = max(1, tokens)
    return sum(1.0 - (1.0 - min(1.0, max(0.0, p))) ** b for p in chances) / len(chances)


@lru_cache(maxsize=1 << 14)
def _touched_cached(chances: tuple[float, ...], tokens: int) -> float:
    """:func:`touched_by`, kept: a plan asks it per device and `tune` per candidate."""
    return touched_by(chances, tokens)


def read_routing(path: str | Path, n_expert: int, n_expert_used: int) -> Routing:
    """The routing an imatrix GGUF measured, for a model of ``n_expert`` experts, ``n_expert_used``
    a token. Raises InputError naming what is wrong and how to make a good file."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise InputError(f"--routing {p}: cannot read it ({e.strerror or e})", hint=MAKE_ONE) from None
    if magic != GGUF_MAGIC:
        raise InputError(
            f"--routing {p}: not a GGUF file (a legacy .dat imatrix keeps no per-expert counts)", hint=MAKE_ONE
        )
    g = read_gguf(p)
    if g.metadata.get("general.type") != "imatrix":
        raise InputError(
            f"--routing {p}: a GGUF file, but not an imatrix (general.type is {g.metadata.get('general.type')!r})",
            hint=MAKE_ONE,
        )
    found: dict[int, dict[str, tuple[float, ...]]] = {}
    with open(p, "rb") as f:
        for t in g.tensors:
            m = _COUNTS.match(t.name)
            if m is None:
                continue
            if t.qtype.name != "F32" or t.nbytes != 4 * math.prod(t.shape):
                raise InputError(f"--routing {p}: {t.name} is {t.qtype.name}, not F32 counts", hint=MAKE_ONE)
            f.seek(t.offset)
            data = f.read(t.nbytes)
            if len(data) != t.nbytes:
                raise InputError(f"--routing {p}: truncated at {t.name}", hint=MAKE_ONE)
            found.setdefault(int(m.group(1)), {})[m.group(2)] = struct.unpack(f"<{t.nbytes // 4}f", data)
    if not found:
        raise InputError(
            f"--routing {p}: no expert counts in it (an imatrix of a dense model, or of an older llama-imatrix)",
            hint=MAKE_ONE,
        )
    layers: dict[int, tuple[float, ...]] = {}
    tokens = 0
    for layer in sorted(found):
        counts = next(found[layer][w] for w in _PREFERRED if w in found[layer])
        if len(counts) != n_expert:
            raise InputError(
                f"--routing {p}: layer {layer} has counts for {len(counts)} experts, the model "
                f"{n_expert}: an imatrix of another model",
                hint=MAKE_ONE,
            )
        n_tok = sum(counts) / max(1, n_expert_used)  # every token chose k experts
        if n_tok <= 0:
            continue
        layers[layer] = tuple(c / n_tok for c in counts)
        tokens = max(tokens, round(n_tok))
    if not layers:
        raise InputError(f"--routing {p}: every expert count is zero", hint=MAKE_ONE)
    return Routing(str(p), layers, tokens)
