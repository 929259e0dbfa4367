"""Every relative link in the user documentation leads somewhere.

The README, SECURITY.md, CHANGELOG.md and every page under docs/ link to
each other, to files of the repository and to headings (`page.md#heading`).
A link to a file that is missing, or to a heading that was renamed, fails
here rather than on a reader. Anchors follow GitHub's rule for heading ids:
the heading's text, lower case, without punctuation other than `-` and `_`,
spaces made hyphens, and `-1`, `-2` … on repeats.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

pytestmark = pytest.mark.backend_independent

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("README.md", "SECURITY.md", "CHANGELOG.md")

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets.
_INLINE_LINK = re.compile(
    r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_HTML_ANCHOR = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
_ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")
_SETEXT_UNDERLINE = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def documentation_files(root: Path) -> list[Path]:
    """The pages whose links are checked: the top-level documents and docs/**."""
    pages = [root / name for name in TOP_LEVEL]
    return pages + sorted((root / "docs").rglob("*.md"))


def _prose_lines(text: str) -> list[str]:
    """The lines of a markdown text, those inside fenced code blocks left empty."""
    lines, fence = [], ""
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = ""
            lines.append("")
            continue
        if opening:
            fence = opening.group(1)
            lines.append("")
            continue
        lines.append(line)
    return lines


def link_targets(text: str) -> list[str]:
    """Every link target in a markdown text: inline, reference definitions, HTML attributes."""
    targets = []
    for line in _prose_lines(text):
        prose = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        targets += [m.group(1) for m in _INLINE_LINK.finditer(prose)]
        targets += [m.group(1) for m in _REFERENCE_DEFINITION.finditer(prose)]
        targets += [m.group(1) for m in _HTML_LINK.finditer(prose)]
    return [target.strip("<>") for target in targets]


def github_slug(heading: str) -> str:
    """The id GitHub gives a heading with this (rendered) text."""
    text = unicodedata.normalize("NFC", heading).strip().lower()
    kept = "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def _rendered(heading: str) -> str:
    """A heading's text as GitHub shows it: no code ticks, emphasis or link targets."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"(\*+|_+)(\S(?:.*?\S)?)\1", r"\2", text)


def anchors(text: str) -> set[str]:
    """The ids a link may name in this markdown text: one per heading, and HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines = _prose_lines(text)
    for number, line in enumerate(lines):
        heading = None
        atx = _ATX_HEADING.match(line)
        if atx:
            heading = atx.group(2) or ""
        elif (number + 1 < len(lines) and line.strip() and not line.lstrip().startswith("|")
              and _SETEXT_UNDERLINE.match(lines[number + 1])
              and not _SETEXT_UNDERLINE.match(line)):
            heading = line
        if heading is not None:
            slug = github_slug(_rendered(heading))
            repeat = seen.get(slug, 0)
            seen[slug] = repeat + 1
            found.add(slug if repeat == 0 else f"{slug}-{repeat}")
        found.update(m.group(1) for m in _HTML_ANCHOR.finditer(line))
    return found


def broken_links(page: Path, root: Path) -> list[str]:
    """The relative links of one page that lead nowhere, each with the reason."""
    problems = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # another site, or mailto: and the like
        path_part, _, fragment = target.partition("#")
        path_part = unquote(path_part)
        if not path_part:
            resolved = page
        elif path_part.startswith("/"):
            resolved = (root / path_part.lstrip("/")).resolve()
        else:
            resolved = (page.parent / path_part).resolve()
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif (fragment and resolved.suffix == ".md"
              and unquote(fragment) not in anchors(resolved.read_text(encoding="utf-8"))):
            problems.append(f"{target}: no heading #{fragment} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", documentation_files(REPO),
                         ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_in_the_documentation_resolves(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(REPO)} is missing"
    assert broken_links(page, REPO) == []


# --- the checker itself ----------------------------------------------------------------


def test_a_readme_link_to_a_missing_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/here.md) [ok too](docs/here.md#two-words) [gone](docs/gone.md)\n"
        "[bad anchor](docs/here.md#three-words) [up](../../etc/passwd)\n"
        '<img src="docs/missing.png" alt="">\n'
        "```\n[in code](nowhere.md)\n```\n`[in a span](nowhere.md)` [web](https://example.com/x)\n")
    assert broken_links(tmp_path / "README.md", tmp_path) == [
        "docs/gone.md: no such file",
        "docs/here.md#three-words: no heading #three-words in here.md",
        "../../etc/passwd: outside the repository",
        "docs/missing.png: no such file",
    ]


@pytest.mark.parametrize(("heading", "slug"), [
    ("Keys: the vault and rotation", "keys-the-vault-and-rotation"),
    ("Long-polls, workers and sockets", "long-polls-workers-and-sockets"),
    ("`gateway serve` --no-worker", "gateway-serve---no-worker"),
    ("What the gateway *does not* defend against", "what-the-gateway-does-not-defend-against"),
    ("[The pages](#x) in Chromium", "the-pages-in-chromium"),
    ("Configuration_file (TOML)", "configuration_file-toml"),
    ("Périphériques 2", "périphériques-2"),
])
def test_anchors_follow_githubs_heading_ids(heading: str, slug: str) -> None:
    assert anchors(f"# {heading}\n") == {slug}


def test_repeated_headings_get_numbered_ids_and_code_blocks_hold_none() -> None:
    text = ("## PostgreSQL\n\ntext\n\n### PostgreSQL\n\n```sh\n# PostgreSQL\n```\n"
            "Setext heading\n--------------\n\n| a |\n|---|\n<a id=\"custom\"></a>\n")
    assert anchors(text) == {"postgresql", "postgresql-1", "setext-heading", "custom"}
