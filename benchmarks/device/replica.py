"""Carry header-exact sparse GGUF replicas to a machine without moetune's dependencies.

A sparse replica is its GGUF header followed by a file hole, so the header bytes and the file
size are all there is to it. `pack` (run where moetune and its `gguf` dependency are installed)
generates the replicas named in MODELS, keeps each file's header gzipped plus a manifest; `unpack`
(standard library and numpy only, e.g. on the GPU machine) writes them back: header, then
truncate to the full size (no disk used).

Routing: in an all-zero MoE model every token's router logits are zero, so every layer picks the
same first k experts for every token. That makes prefill unrealistically cheap on the GPU (a few
experts with many rows each instead of most experts with a few rows). `unpack --route` therefore
writes real data into the few tensors that decide routing: random int8 token embeddings (q8_0),
ones in the norm in front of the router, random router weights (std 0.02 -> logits of std ~1).
With all other weights zero the residual stream stays equal to the token's embedding, so every
layer routes each (random) token to its own set of experts. Everything else stays a hole.

    python3 replica.py pack OUTDIR [NAME ...]          # here: writes OUTDIR/manifest.json + *.hdr.gz
    python3 replica.py unpack PACKDIR MODELDIR [NAME ...] [--route]   (names before the option)
    python3 replica.py list PACKDIR
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import struct
import sys
import time
from pathlib import Path

# name -> (how it is generated: moetune preset or (arch, dims), type recipe, shards,
#          regex of the norm in front of the router (None: no routing patch))
MODELS: dict[str, dict] = {
    # GLM-5.1 744B-A40B shape with mainline types (the lead's bench_plan.MAINLINE_GLM recipe)
    "GLM-5.1-mainline": {
        "preset": "glm-5.1",
        "type": "ffn_gate_exps=iq3_s,ffn_up_exps=iq3_s,ffn_down_exps=iq4_xs,token_embd=q4_k,other=q8_0",
        "shards": 8,
        "router_norm": None,
    },
    # Qwen3-30B-A3B shape (config.json of Qwen/Qwen3-30B-A3B), Q4_K_M-like types
    "Qwen3-30B-A3B-shape": {
        "arch": "qwen3moe",
        "dims": dict(
            n_layer=48,
            n_embd=2048,
            n_head=32,
            n_head_kv=4,
            head_dim=128,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=768,
            n_vocab=151936,
            n_ctx_train=40960,
        ),
        "type": "ffn_gate_exps=q4_k,ffn_up_exps=q4_k,ffn_down_exps=q6_k,token_embd=q8_0,output=q6_k,other=q8_0",
        "shards": 1,
        "router_norm": r"blk\.\d+\.ffn_norm\.weight",
    },
    # GLM-4.5-Air shape (config.json of zai-org/GLM-4.5-Air); expert ff 1408 is not a multiple of
    # 256, so down experts use iq4_nl (blocks of 32) as llama-quantize's fallback would
    "GLM-4.5-Air-shape": {
        "arch": "glm4moe",
        "dims": dict(
            n_layer=46,
            n_nextn=1,
            n_embd=4096,
            n_head=96,
            n_head_kv=8,
            head_dim=128,
            n_ff=10944,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=1408,
            n_expert_shared=1,
            n_dense_lead=1,
            n_vocab=151552,
            n_ctx_train=131072,
        ),
        "type": "ffn_gate_exps=q4_k,ffn_up_exps=q4_k,ffn_down_exps=iq4_nl,token_embd=q8_0,other=q8_0",
        "shards": 1,
        "router_norm": r"blk\.\d+\.post_attention_norm\.weight",
    },
    # tiny model for a dry run of the device script on a CPU-only machine
    "tiny-qwen3moe": {
        "arch": "qwen3moe",
        "dims": dict(
            n_layer=4,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            head_dim=64,
            n_expert=8,
            n_expert_used=2,
            n_ff_exp=256,
            n_vocab=512,
            n_ctx_train=8192,
        ),
        "type": "q8_0",
        "shards": 1,
        "router_norm": r"blk\.\d+\.ffn_norm\.weight",
    },
}

# --- minimal GGUF header reader (standard library only) ---------------------------------------

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8


class _R:
    def __init__(self, f):
        self.f = f
        self.pos = 0

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF header")
        self.pos += n
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.read(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.read(8))[0]

    def str(self) -> str:
        return self.read(self.u64()).decode("utf-8", "replace")

    def value(self, t: int):
        if t in _SCALAR:
            fmt = "<" + _SCALAR[t]
            return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        if t == 8:
            return self.str()
        if t == 9:
            et, n = self.u32(), self.u64()
            if et in _SCALAR:  # skip arrays of scalars quickly
                self.read(struct.calcsize("<" + _SCALAR[et]) * n)
                return None
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def read_header(path: Path) -> dict:
    """data_offset, alignment and tensors [(name, type, dims, offset-in-data)] of one GGUF file."""
    with open(path, "rb") as f:
        r = _R(f)
        if r.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.u32()
        n_tensors, n_kv = r.u64(), r.u64()
        align = 32
        for _ in range(n_kv):
            key = r.str()
            v = r.value(r.u32())
            if key == "general.alignment":
                align = int(v)
        tensors = []
        for _ in range(n_tensors):
            name = r.str()
            nd = r.u32()
            dims = [r.u64() for _ in range(nd)]
            ttype = r.u32()
            off = r.u64()
            tensors.append((name, ttype, dims, off))
        data_offset = (r.pos + align - 1) // align * align
    return {"version": version, "alignment": align, "data_offset": data_offset, "tensors": tensors}


def _tensor_bytes(ttype: int, dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    if ttype == GGML_F32:
        return 4 * n
    if ttype == GGML_F16:
        return 2 * n
    if ttype == GGML_Q8_0:
        return n // 32 * 34
    raise ValueError(f"no size rule for ggml type {ttype} here")


# --- pack (here) --------------------------------------------------------------------------------


def pack(outdir: Path, names: list[str], workdir: Path) -> None:
    from moetune.model.archs import PRESETS, Dims
    from moetune.model.testmodel import generate

    outdir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    manifest_path = outdir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    for name in names or list(MODELS):
        spec = MODELS[name]
        if "preset" in spec:
            arch, dims = PRESETS[spec["preset"]]
        else:
            arch, dims = spec["arch"], Dims(**spec["dims"])
        for old in workdir.glob(f"{name}*.gguf"):
            old.unlink()
        g = generate(workdir / f"{name}.gguf", arch, dims, spec["type"], shards=spec["shards"], sparse=True)
        files = []
        patches = []
        for p in g.files:
            h = read_header(p)
            head = p.open("rb").read(h["data_offset"])
            (outdir / f"{p.name}.hdr.gz").write_bytes(gzip.compress(head, 6, mtime=0))
            files.append(
                {
                    "name": p.name,
                    "size": p.stat().st_size,
                    "header_bytes": len(head),
                    "header_sha256": hashlib.sha256(head).hexdigest(),
                }
            )
            if spec["router_norm"]:
                for tname, ttype, tdims, off in h["tensors"]:
                    kind = None
                    if tname == "token_embd.weight":
                        kind = "q8_0_random" if ttype == GGML_Q8_0 else None
                        if kind is None:
                            raise SystemExit(f"{name}: token_embd must be q8_0 for --route")
                    elif re.fullmatch(spec["router_norm"], tname):
                        kind = "ones"
                    elif re.fullmatch(r"blk\.\d+\.ffn_gate_inp\.weight", tname):
                        kind = "randn"
                    if kind is None:
                        continue
                    if kind in ("ones", "randn") and ttype != GGML_F32:
                        raise SystemExit(f"{name}: {tname} is type {ttype}, expected F32")
                    patches.append(
                        {
                            "file": p.name,
                            "tensor": tname,
                            "fill": kind,
                            "type": ttype,
                            "dims": tdims,
                            "offset": h["data_offset"] + off,
                            "nbytes": _tensor_bytes(ttype, tdims),
                        }
                    )
        manifest["models"][name] = {
            "arch": arch,
            "type": spec["type"],
            "shards": spec["shards"],
            "dims": {k: getattr(dims, k) for k in dims.__dataclass_fields__},
            "tensor_bytes": g.tensor_bytes,
            "files": files,
            "route_patches": patches,
        }
        print(
            f"{name}: {len(files)} file(s), {g.tensor_bytes / 2**30:.2f} GiB of tensors, "
            f"{sum(f['header_bytes'] for f in files) / 2**20:.1f} MiB of headers, {len(patches)} routing patches"
        )
    manifest_path.write_text(json.dumps(manifest, indent=1))


# --- unpack (anywhere with numpy) ----------------------------------------------------------------


def _fill(f, patch: dict, rng) -> None:
    import numpy as np

    f.seek(patch["offset"])
    n = patch["nbytes"]
    if patch["fill"] == "ones":
        f.write(np.ones(n // 4, dtype="<f4").tobytes())
    elif patch["fill"] == "randn":
        f.write((rng.standard_normal(n // 4, dtype=np.float32) * np.float32(0.02)).astype("<f4").tobytes())
    elif patch["fill"] == "q8_0_random":
        blk = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
        nblk = n // 34
        step = 1 << 20
        for i in range(0, nblk, step):
            m = min(step, nblk - i)
            a = np.empty(m, dtype=blk)
            a["d"] = np.float16(1.0 / 127)
            a["qs"] = rng.integers(-127, 128, size=(m, 32), dtype=np.int8)
            f.write(a.tobytes())
    else:
        raise ValueError(patch["fill"])


def unpack(packdir: Path, modeldir: Path, names: list[str], route: bool) -> None:
    manifest = json.loads((packdir / "manifest.json").read_text())
    modeldir.mkdir(parents=True, exist_ok=True)
    for name in names or list(manifest["models"]):
        m = manifest["models"][name]
        t0 = time.time()
        for fi in m["files"]:
            head = gzip.decompress((packdir / f"{fi['name']}.hdr.gz").read_bytes())
            if hashlib.sha256(head).hexdigest() != fi["header_sha256"]:
                raise SystemExit(f"{fi['name']}: header checksum mismatch")
            p = modeldir / fi["name"]
            with open(p, "wb") as f:
                f.write(head)
                f.truncate(fi["size"])
        if route and m["route_patches"]:
            import numpy as np

            rng = np.random.default_rng(0)
            by_file: dict[str, list[dict]] = {}
            for pt in m["route_patches"]:
                by_file.setdefault(pt["file"], []).append(pt)
            for fname, pts in by_file.items():
                with open(modeldir / fname, "r+b") as f:
                    for pt in pts:
                        _fill(f, pt, rng)
        written = sum(pt["nbytes"] for pt in m["route_patches"]) if route else 0
        print(
            f"{name}: {modeldir / m['files'][0]['name']} ({sum(fi['size'] for fi in m['files']) / 2**30:.2f} GiB, "
            f"{written / 2**20:.0f} MiB of routing data written) in {time.time() - t0:.1f} s",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("outdir", type=Path)
    a.add_argument("names", nargs="*")
    a.add_argument("--workdir", type=Path, default=Path("/tmp/moetune-replicas"))
    b = sub.add_parser("unpack")
    b.add_argument("packdir", type=Path)
    b.add_argument("modeldir", type=Path)
    b.add_argument("names", nargs="*")
    b.add_argument("--route", action="store_true")
    c = sub.add_parser("list")
    c.add_argument("packdir", type=Path)
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args.outdir, args.names, args.workdir)
    elif args.cmd == "unpack":
        unpack(args.packdir, args.modeldir, args.names, args.route)
    else:
        for name, m in json.loads((args.packdir / "manifest.json").read_text())["models"].items():
            print(name, m["files"][0]["name"], sum(f["size"] for f in m["files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
