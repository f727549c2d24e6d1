"""The documentation covers the public surface: every option in the table, every page reachable.

Issue 28, item 6: the options table lacked ``show_progress``, ``progress_interval_sec``,
``progress_all_ranks`` and ``use_manifest``; the site had no landing page; the README's
list of pages left four out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_dataloader_utils.runtime import options

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TYPED_OPTIONS = [
    options.FileLoaderOptions,
    options.IcebergLoaderOptions,
    options.FileReadOptions,
    options.IcebergReadOptions,
    options.LoaderOptions,
]


def options_table() -> str:
    """The rows of the user guide's table of every option."""
    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    section = text.split("## Every option of `create_dataloader`", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


@pytest.mark.parametrize(
    "name",
    sorted({k for td in TYPED_OPTIONS for k in td.__required_keys__ | td.__optional_keys__}),
)
def test_every_option_is_in_the_options_table(name: str) -> None:
    assert f"`{name}`" in options_table(), f"{name} (runtime/options.py) is missing from docs/user-guide.md"


def nav_pages() -> list[str]:
    return re.findall(r"^\s+- [^:]+: (\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), re.M)


def test_the_site_has_a_landing_page_first() -> None:
    assert (DOCS / "index.md").is_file()
    assert nav_pages()[0] == "index.md"


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_page_is_in_the_site_and_listed_by_the_readme(page: str) -> None:
    assert page in nav_pages(), f"docs/{page} is not in mkdocs.yml's nav"
    if page != "index.md":
        readme = (REPO / "README.md").read_text(encoding="utf-8")
        assert f"(docs/{page})" in readme, f"docs/{page} is missing from the README's documentation list"
        index = (DOCS / "index.md").read_text(encoding="utf-8")
        assert f"({page})" in index, f"docs/{page} is missing from docs/index.md"
