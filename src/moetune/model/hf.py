"""``--hf OWNER/REPO[:QUANT]``: find a model's first file in a Hugging Face-style repository.

The repository's files come from ``{endpoint}/api/models/{owner}/{repo}`` (``siblings`` of
``{rfilename}``), a file from ``{endpoint}/{owner}/{repo}/resolve/main/{path}``; the endpoint is
``HF_ENDPOINT`` (default https://huggingface.co). QUANT is a file, a directory (``IQ3_KS``,
``UD-Q2_K_XL``), or a quant tag in the file names (``Q4_K_M``, as llama.cpp's ``-hf`` takes it).
Choosing the file is a pure function (:func:`choose`); only :func:`resolve` does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from moetune.errors import InputError, RuntimeFailure
from moetune.model.gguf_read import SHARD_RE
from moetune.model.remote import Client, NotFound

_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<sel>.+))?$")


@dataclass(frozen=True, slots=True)
class Choice:
    """One model in a repository: its first file and a glob matching every file of it."""

    repo: str
    path: str  # the first (or only) file's path in the repository
    n_files: int
    include: str  # for `hf download --include`

    def download_command(self) -> str:
        return f"hf download {self.repo} --include '{self.include}' --local-dir ."


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``OWNER/REPO[:QUANT]`` → (repo, quant or None)."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise InputError(
            f"--hf {spec!r}: expected OWNER/REPO or OWNER/REPO:QUANT (a directory, a file or a quant "
            "tag such as Q4_K_M)"
        )
    return m["repo"], (m["sel"].strip("/") or None) if m["sel"] else None


def models_in(files: list[str]) -> list[Choice]:
    """The GGUF models among a repository's files: a single file each, or a split set (by name).
    Multimodal projectors (mmproj) are left out, as llama.cpp's -hf does."""
    out: dict[str, Choice] = {}
    for f in sorted(files):
        head, _, name = f.rpartition("/")
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        prefix = f"{head}/" if head else ""
        m = SHARD_RE.match(name)
        if m is None:
            out[f] = Choice("", f, 1, f)
            continue
        key = f"{prefix}{m['stem']}-of-{m['count']}"
        if key not in out:
            first = f"{prefix}{m['stem']}-00001-of-{m['count']}.gguf"
            out[key] = Choice("", first, int(m["count"]), f"{prefix}{m['stem']}-*-of-{m['count']}.gguf")
    return list(out.values())


def _label(c: Choice) -> str:
    return c.path if c.n_files == 1 else f"{c.path} ({c.n_files} shards)"


def choose(repo: str, files: list[str], sel: str | None) -> Choice:
    """The one model ``sel`` names in the repository (InputError listing the candidates otherwise)."""
    models = [Choice(repo, c.path, c.n_files, c.include) for c in models_in(files)]
    if not models:
        raise InputError(
            f"{repo}: no GGUF file in the repository ({len(files)} files)",
            hint="check the repository name; GGUF quants often live in a separate '-GGUF' repository",
        )
    picked = models
    if sel is not None:
        exact = [c for c in models if sel in files and _member(c, sel)]
        under = [c for c in models if c.path.startswith(sel + "/")]
        tag = re.compile(rf"(?:^|[-./]){re.escape(sel)}(?:[-./]|$)", re.I)
        picked = exact or under or [c for c in models if tag.search(c.path)]
        if not picked:
            raise InputError(
                f"{repo}: nothing matches {sel!r}",
                hint="choose one of the models listed below",
                details=tuple(_label(c) for c in models),
            )
    if len(picked) > 1:
        raise InputError(
            f"{repo}{':' + sel if sel else ''}: {len(picked)} models match; name one with "
            f"{repo}:QUANT (a directory, a file or a quant tag)",
            details=tuple(_label(c) for c in picked),
        )
    return picked[0]


def _member(c: Choice, path: str) -> bool:
    """The file ``path`` belongs to model ``c`` (is it, or one of its shards)."""
    if c.n_files == 1:
        return path == c.path
    return re.fullmatch(re.escape(c.include).replace(r"\*", r"\d{5}"), path) is not None


def file_url(endpoint: str, repo: str, path: str) -> str:
    return f"{endpoint}/{repo}/resolve/main/{quote(path)}"


def list_files(client: Client, endpoint: str, repo: str) -> list[str]:
    url = f"{endpoint}/api/models/{repo}"
    try:
        doc = client.json(url)
    except NotFound:
        raise InputError(
            f"{repo}: no such repository at {endpoint} (HTTP 404)",
            hint="check OWNER/REPO; a private or gated one also needs HF_TOKEN",
        ) from None
    siblings = doc.get("siblings") if isinstance(doc, dict) else None
    if not isinstance(siblings, list):
        raise RuntimeFailure(
            f"{url}: the answer has no 'siblings' list", hint="is HF_ENDPOINT a Hugging Face-style hub?"
        )
    return [s["rfilename"] for s in siblings if isinstance(s, dict) and isinstance(s.get("rfilename"), str)]


def resolve(client: Client, endpoint: str, spec: str) -> tuple[Choice, str]:
    """The model ``--hf spec`` names, and the URL of its first file."""
    repo, sel = parse_spec(spec)
    c = choose(repo, list_files(client, endpoint, repo), sel)
    return c, file_url(endpoint, repo, c.path)
