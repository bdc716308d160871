"""mkdocs hooks (mkdocs.yml `hooks:`): the README and the CHANGELOG as pages of the site.

Both live at the repository's root, where GitHub shows them, so they are not copied into docs/
(one source each): the site gets them as generated pages, `readme.md` and `changelog.md`, with the
README's links into `docs/` made relative to the site and its links to the root's files pointed
at their pages.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def readme_page(text: str) -> str:
    text = re.sub(r"\]\(docs/", "](", text)
    text = text.replace("](CHANGELOG.md)", "](changelog.md)")
    return re.sub(r"\[LICENSE\]\(LICENSE\)", "LICENSE", text)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "readme.md", content=readme_page((ROOT / "README.md").read_text())))
    files.append(File.generated(config, "changelog.md", content=(ROOT / "CHANGELOG.md").read_text()))
    return files
