"""The YAML files a user writes (hardware, layout): parsed safely, their errors said on one line.

PyYAML's and pydantic's messages span several lines (the offending line quoted, a caret under it)
and quote the file's own text; moetune prints an error as one line, so both are flattened here:
``FILE: line 7, column 3: expected <block end>, but found '<block mapping start>'``.
yaml and pydantic are imported only when a file is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moetune.errors import InputError, one_line

if TYPE_CHECKING:
    from pydantic import ValidationError


def parse(data: bytes | str, source: str) -> Any:
    """The document a YAML file holds; InputError (one line) where it is not UTF-8 or not YAML."""
    import yaml

    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise InputError(
            f"{source}: not valid YAML (not UTF-8 text: byte {e.start} is {data[e.start : e.start + 1]!r})"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = e.problem or e.context or "cannot parse"
        context = f" ({e.context})" if e.context and e.problem else ""
        raise InputError(f"{source}: not valid YAML ({where}{one_line(what)}{one_line(context)})") from None
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML ({one_line(str(e))})") from None
    except RecursionError:
        raise InputError(f"{source}: not valid YAML (nested too deeply)") from None


def schema_error(source: str, e: ValidationError, hint: str | None = None) -> InputError:
    """The first thing a document's schema refused, as ``SOURCE: where.in.document: why``."""
    first = e.errors()[0]
    loc = ".".join(one_line(str(x), 60) for x in first["loc"]) or "the document"
    return InputError(f"{source}: {loc}: {one_line(first['msg'])}", hint=hint)
