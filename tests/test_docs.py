"""The documentation's structure: a short README, docs/ pages it links, links that resolve.

Oracles: the file system (every relative Markdown link must name an existing file or folder) and
the parsing rule of ``.ci/run`` (the ```bash fence after the line starting with ``## Set-up``,
its non-comment non-empty lines: CI runs exactly those two commands).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

# [text](target) and ![alt](target); target up to the first space or ')' (an optional "title" after)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _strip_code(text: str) -> str:
    """The text without fenced code blocks and inline code spans (links there are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            marker = m.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def _links(path: Path) -> list[str]:
    return _LINK.findall(_strip_code(path.read_text(encoding="utf-8")))


def _setup_commands(text: str) -> list[str]:
    """As ``.ci/run`` reads them: the ```bash fence after "## Set-up", its command lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## Set-up"))
    commands, inside = [], False
    for line in lines[start + 1:]:
        if line.startswith("```"):
            if inside:
                break
            inside = True
            continue
        if inside and line.strip() and not line.strip().startswith("#"):
            commands.append(line)
    return commands


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES} (move text to docs/)"


def test_docs_pages_exist():
    assert _pages(), "docs/ has no Markdown pages"


@pytest.mark.parametrize("path", [README, *_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    broken = []
    for target in _links(path):
        if _EXTERNAL.match(target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        if not (path.parent / file_part).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files or folders: {broken}"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces -> '-'."""
    anchors = set()
    for line in _strip_code_keep_headings(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).replace("`", "").lower()).replace(" ", "-"))
    return anchors


def _strip_code_keep_headings(text: str) -> str:
    out, fence = [], False
    for line in text.splitlines():
        if re.match(r"^\s*(`{3,}|~{3,})", line):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("path", [README, *_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_resolve(path: Path):
    """A link to a heading of a Markdown page (``page.md#anchor``, ``#anchor``) names a heading there."""
    broken = []
    for target in _links(path):
        if _EXTERNAL.match(target) or "#" not in target:
            continue
        file_part, anchor = target.split("#", 1)
        page = (path.parent / file_part) if file_part else path
        if page.suffix == ".md" and page.is_file() and anchor not in _anchors(page):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing headings: {broken}"


def test_setup_block_has_two_commands():
    commands = _setup_commands(README.read_text(encoding="utf-8"))
    assert len(commands) == 2, f"README set-up: expected 2 commands (.ci/run runs them), found {commands}"


def test_setup_parse_matches_ci_script():
    """The rule above is the one in .ci/run (its awk program), not a guess."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "/^## Set-up/" in ci and "README.md" in ci


def test_every_docs_page_linked_from_readme():
    linked = set()
    for target in _links(README):
        if _EXTERNAL.match(target):
            continue
        linked.add((README.parent / target.split("#", 1)[0]).resolve())
    missing = [str(p.relative_to(ROOT)) for p in _pages() if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_link_parser():
    text = "a [x](docs/a.md#b) `[not](c.md)` ![img](r.png \"t\") [m](mailto:a@b) [h](https://x)\n```\n[no](d.md)\n```\n"
    assert _LINK.findall(_strip_code(text)) == ["docs/a.md#b", "r.png", "mailto:a@b", "https://x"]
