"""Regular expressions over layer numbers, for tensor names (`-ot` placements, quant recipes)."""

from __future__ import annotations

import re

__all__ = ["int_range_regex", "layers_regex"]


def int_range_regex(a: int, b: int) -> str:
    """A regex matching exactly the decimal integers a..b (no leading zeros)."""
    if a > b:
        raise ValueError("empty range")
    sa, sb = str(a), str(b)
    if len(sa) < len(sb):
        parts = [int_range_regex(a, 10 ** len(sa) - 1)]
        for n in range(len(sa) + 1, len(sb)):
            parts.append(int_range_regex(10 ** (n - 1), 10**n - 1))
        parts.append(int_range_regex(10 ** (len(sb) - 1), b))
        return "|".join(parts)
    if sa == sb:
        return sa
    # same length: split on the first differing digit
    i = next(j for j in range(len(sa)) if sa[j] != sb[j])
    prefix, rest = sa[:i], len(sa) - i - 1
    lo, hi = int(sa[i]), int(sb[i])
    if sa[i + 1 :] == "0" * rest and sb[i + 1 :] == "9" * rest:
        digit = sa[i] if lo == hi else f"[{lo}-{hi}]"
        return prefix + digit + ("[0-9]" * rest if rest < 2 else f"[0-9]{{{rest}}}")
    parts = []
    if sa[i + 1 :] != "0" * rest:
        parts.append(int_range_regex(int(sa), int(prefix + sa[i] + "9" * rest)))
        lo += 1
    tail = sb[i + 1 :] != "9" * rest
    if tail:
        hi -= 1
    if lo <= hi:
        parts.append(int_range_regex(int(prefix + str(lo) + "0" * rest), int(prefix + str(hi) + "9" * rest)))
    if tail:
        parts.append(int_range_regex(int(prefix + sb[i] + "0" * rest), int(sb)))
    return "|".join(parts)


def layers_regex(layers: list[int]) -> str:
    """Compact alternation for a set of layer numbers: [3,4,5,...,40,77] -> ([3-9]|[1-3][0-9]|40|77)."""
    xs = sorted(set(layers))
    runs: list[tuple[int, int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    alts = "|".join(int_range_regex(a, b) for a, b in runs)
    return alts if re.fullmatch(r"\d+", alts) else f"({alts})"
