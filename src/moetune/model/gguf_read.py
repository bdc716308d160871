"""Read GGUF headers (metadata and tensor infos) without touching the data region.

Our own reader rather than ``gguf.GGUFReader``: that one maps every tensor into numpy and rejects
type ids it does not know (all of ik_llama.cpp's), and reads one file at a time. This one reads
only the header, knows every type in :mod:`moetune.model.quants`, checks the file is long
enough for the tensors it declares, and skips large arrays (the vocabulary) without building
Python objects for them.

The parser reads from a :class:`ByteSource`: the header is read from byte 0 onwards, so a source is
a growing prefix of the file. A local file is mapped (the first MAX_HEADER bytes); a remote one
(:mod:`moetune.model.remote`) fetches more of its prefix as the parser asks for it. Both go through
every line of the same parser.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from moetune.errors import InputError
from moetune.model.quants import QuantType, UnknownQuantType, by_id

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are not materialised; their length is kept instead.
MAX_ARRAY_KEEP = 4096

# value type ids of the GGUF format, and the struct format of each scalar one (read and written)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMATS = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}
_SCALAR, _STRING, _ARRAY = SCALAR_FORMATS, STRING, ARRAY
_U64 = struct.Struct("<Q")

SHARD_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
MIN_HEADER = 24  # magic, version, tensor count, metadata count
# The most of a file the reader reads: the largest real headers (a 256k-token vocabulary and its
# merges) are tens of MiB. A damaged length beyond this would have it read, and over HTTP
# download and hold, gigabytes of data region.
MAX_HEADER = 128 << 20

Buffer = mmap.mmap | bytes | bytearray


class ByteSource(Protocol):
    """A file's bytes as the header parser reads them: from its start, in order."""

    @property
    def path(self) -> Path | str:  # a local path, or a URL; named in messages and kept in GGUFFile
        ...

    @property
    def size(self) -> int:  # the file's length in bytes
        ...

    def prefix(self, end: int) -> Buffer:
        """A buffer whose first ``end`` bytes (``end <= size``) are the file's first bytes; it may hold more."""
        ...


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """A metadata array too long to keep (e.g. the token list): its element type and length."""

    item_type: int
    length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (row length) first
    qtype: QuantType
    offset: int  # absolute byte offset in its file
    nbytes: int
    file_index: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFFile:
    path: Path | str  # a URL for a file read over HTTP
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int
    header_bytes: int = field(default=0)


class _Cursor:
    """Reads values at ``pos``; asks the source for more of the file when the buffer runs out."""

    __slots__ = ("buf", "path", "pos", "size", "src")

    def __init__(self, src: ByteSource) -> None:
        self.src = src
        self.path = src.path
        self.size = src.size
        self.buf = src.prefix(min(self.size, MIN_HEADER))
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end <= len(self.buf) and end <= MAX_HEADER:
            return
        if end > self.size:
            raise InputError(
                f"{self.path}: file is truncated (header ends at byte {self.size} while reading {what})",
                hint="re-download or re-copy the file; compare its size with the source",
            )
        if end > MAX_HEADER:
            raise InputError(
                f"{self.path}: corrupt header (it runs past {MAX_HEADER >> 20} MiB while reading {what})",
                hint="a real header (vocabulary included) is tens of MiB; this one's lengths are damaged",
            )
        self.buf = self.src.prefix(end)

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > 1 << 24:
            raise InputError(f"{self.path}: corrupt header (a string of {n} bytes while reading {what})")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype = self.unpack("<I", what)
            n = self.unpack("<Q", what)
            if itype not in _SCALAR and itype != _STRING:
                raise InputError(f"{self.path}: corrupt header (array of unknown type {itype} in {what})")
            if n > MAX_ARRAY_KEEP:
                self.skip_array(itype, n, what)
                return SkippedArray(itype, n)
            return [self.value(itype, what) for _ in range(n)]
        raise InputError(f"{self.path}: corrupt header (unknown value type {vtype} in {what})")

    def skip_array(self, itype: int, n: int, what: str) -> None:
        if itype == _STRING:
            # The hot loop of reading a header (the vocabulary): no bound check per string, since
            # unpack_from raises once a length runs past the buffer; then the buffer grows (a
            # remote source) or the file is truncated (need says which).
            # The view stops at MAX_HEADER: a damaged count over a long run of zeros (a sparse
            # replica's data region) would otherwise walk it 8 bytes at a time.
            pos, unpack, i = self.pos, _U64.unpack_from, 0
            while i < n:
                with memoryview(self.buf) as whole, whole[:MAX_HEADER] as buf:
                    try:
                        while i < n:
                            pos += 8 + unpack(buf, pos)[0]
                            i += 1
                    except (struct.error, OverflowError):
                        pass
                if i < n:
                    self.pos = pos
                    self.need(8, what)
            self.pos = pos
            self.need(0, what)
        else:
            nbytes = struct.calcsize(_SCALAR[itype]) * n
            self.need(nbytes, what)
            self.pos += nbytes


@dataclass(frozen=True, slots=True)
class _MappedFile:
    """A local file as a ByteSource: its first MAX_HEADER bytes mapped, so every prefix the parser
    may ask for is already there."""

    path: Path
    size: int
    buf: Buffer

    def prefix(self, end: int) -> Buffer:
        return self.buf


def read_gguf(path: str | os.PathLike[str], file_index: int = 0) -> GGUFFile:
    """Parse one GGUF file's header. Raises InputError naming the problem."""
    from moetune.paths import readable_file

    p = readable_file(path, "GGUF file")
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as e:  # changed since it was checked
        raise InputError(f"{p}: cannot open ({e.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if size < MIN_HEADER:
            return parse(_MappedFile(p, size, b""), file_index)  # says it is truncated
        # only the window a header may take: a 300 GiB model mapped whole fails under a limit on
        # address space (ulimit -v), and the data region is never read
        with mmap.mmap(fd, min(size, MAX_HEADER), access=mmap.ACCESS_READ) as mm:
            return parse(_MappedFile(p, size, mm), file_index)
    finally:
        os.close(fd)


def shown(v: Any, limit: int = 60) -> str:
    """A name or value from a header as a message shows it: quoted, control characters escaped (an
    error is one line), cut to ``limit`` characters (a damaged length can make a name megabytes long)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + f"...({len(r)} characters)"


def parse(src: ByteSource, file_index: int = 0) -> GGUFFile:
    """Parse the header a source holds (local or remote: the one parser)."""
    path, size = src.path, src.size
    if size < MIN_HEADER:
        raise InputError(
            f"{path}: file is truncated ({size} bytes; a GGUF header needs at least {MIN_HEADER})",
            hint="re-download or re-copy the file; compare its size with the source",
        )
    c = _Cursor(src)
    magic = bytes(c.buf[:4])
    if magic != GGUF_MAGIC:
        raise InputError(f"{path}: not a GGUF file (bad magic {magic!r})")
    c.pos = 4
    version = c.unpack("<I", "version")
    if version not in (2, 3):
        raise InputError(f"{path}: unsupported GGUF version {version} (moetune reads versions 2 and 3)")
    n_tensors = c.unpack("<Q", "tensor count")
    n_kv = c.unpack("<Q", "metadata count")
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise InputError(f"{path}: corrupt header ({n_tensors} tensors, {n_kv} metadata keys)")
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key #{i}")
        vtype = c.unpack("<I", f"type of {shown(key)}")
        meta[key] = c.value(vtype, shown(key))
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        name = c.string(f"tensor #{i} name")
        what = f"tensor {shown(name)}"
        n_dims = c.unpack("<I", f"dims of {what}")
        if n_dims > 8:
            raise InputError(f"{path}: corrupt header ({what} has {n_dims} dimensions)")
        shape = tuple(c.unpack("<Q", f"shape of {what}") for _ in range(n_dims))
        type_id = c.unpack("<I", f"type of {what}")
        offset = c.unpack("<Q", f"offset of {what}")
        raw.append((name, shape, type_id, offset))
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise InputError(f"{path}: corrupt header (alignment {shown(alignment)} is not a power of two)")
    header_end = c.pos
    data_offset = (header_end + alignment - 1) // alignment * alignment
    tensors = []
    for name, shape, type_id, offset in raw:
        try:
            qt = by_id(type_id)
        except UnknownQuantType:
            raise InputError(
                f"{path}: tensor {shown(name)} has unknown type id {type_id}",
                hint="the file was written by a newer or different engine; update moetune",
            ) from None
        try:
            nbytes = qt.tensor_bytes(shape)
        except ValueError as e:
            raise InputError(f"{path}: tensor {shown(name)}: {e}") from None
        start = data_offset + offset
        if start + nbytes > size:
            raise InputError(
                f"{path}: file is truncated (tensor {shown(name)} ends at byte {start + nbytes}, file has {size})",
                hint="re-download or re-copy the file; compare its size with the source",
            )
        tensors.append(TensorInfo(name=name, shape=shape, qtype=qt, offset=start, nbytes=nbytes, file_index=file_index))
    return GGUFFile(
        path=path,
        version=version,
        metadata=meta,
        tensors=tuple(tensors),
        alignment=alignment,
        data_offset=data_offset,
        file_size=size,
        header_bytes=header_end,
    )


def shard_names(name: str) -> list[str]:
    """The file names of every shard of a split model, given one of them (llama-gguf-split naming);
    just ``[name]`` for a single file."""
    m = SHARD_RE.match(name)
    if not m:
        return [name]
    count = int(m["count"])
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """All shards of a split model, given any one of them."""
    p = Path(path)
    paths = [p.with_name(n) for n in shard_names(p.name)]
    if len(paths) == 1:
        return [p]
    missing = [q.name for q in paths if not q.exists()]
    if missing:
        raise InputError(
            f"{p.parent}: missing shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {len(paths)}",
            hint="all shards must sit in the same directory",
        )
    return paths


def check_split(files: list[GGUFFile]) -> list[GGUFFile]:
    """The shards, once their split metadata agrees with their names (InputError where it does not)."""
    if len(files) > 1:
        for i, f in enumerate(files):
            no = f.metadata.get("split.no")
            count = f.metadata.get("split.count")
            if no is not None and (no != i or count != len(files)):
                raise InputError(f"{f.path}: split metadata says shard {no} of {count}, expected {i} of {len(files)}")
    return files


def read_model_files(path: str | os.PathLike[str]) -> list[GGUFFile]:
    """Read every shard's header, checking the split metadata agrees."""
    return check_split([read_gguf(q, i) for i, q in enumerate(shard_paths(path))])
