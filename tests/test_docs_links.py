"""The documentation's relative links resolve: every ``[text](target)`` in ``docs/``,
``README.md``, ``CONTRIBUTING.md``, ``CHANGELOG.md``, ``benchmarks/`` and ``deploy/`` names a
file or folder of the checkout, and every ``#anchor`` names a heading (GitHub's slugs) or an
``<a id>`` of the page it points into. Every page under ``docs/`` is reachable from
``docs/index.md``; every how-to page is in the README's documentation list and the index; no
table is cut by a blank line. CONTRIBUTING.md's module map names every module, with the layers
it imports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine_independent  # the pages on disk, no database

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md"]
    for folder in ("docs", "deploy", "benchmarks"):
        pages += sorted((ROOT / folder).rglob("*.md"))
    return [page for page in pages if page.exists()]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks (links inside code are not links)."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    found: set[str] = set(_HTML_ID.findall(text))
    seen: dict[str, int] = {}
    for _hashes, heading in _HEADING.findall(_prose(text)):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def _targets(page: Path) -> list[str]:
    text = _CODE.sub("", _prose(page.read_text()))
    return _LINK.findall(text) + _REFDEF.findall(text)


def _broken(page: Path) -> list[str]:
    broken = []
    for target in _targets(page):
        if _EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{target}: no heading #{anchor}")
    return broken


def _linked_pages(page: Path) -> set[Path]:
    found = set()
    for target in _targets(page):
        path = target.partition("#")[0]
        if path and not _EXTERNAL.match(target):
            found.add((page.parent / path).resolve())
    return found


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert _broken(page) == []


_CUT_TABLE = re.compile(r"^\|.*\|[ \t]*\n[ \t]*\n(\|.*\|)[ \t]*\n(?!\|[ :|-]+\|)", re.M)


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_no_table_is_cut_by_a_blank_line(page: Path) -> None:
    """A blank line ends a Markdown table: rows after it (no header row of their own) render as
    text."""
    assert _CUT_TABLE.findall(_prose(page.read_text())) == []


def test_slugs_follow_github() -> None:
    assert _slug("The test suite (`bin/test`)") == "the-test-suite-bintest"
    assert _slug('`OPTIONS["BACKOFF"]`') == "optionsbackoff"
    assert _slug("E020: a [queue](x.md) is *declared*") == "e020-a-queue-is-declared"
    assert _slug("Pause and resume, per queue") == "pause-and-resume-per-queue"


def test_every_docs_page_is_reachable_from_the_index() -> None:
    docs = ROOT / "docs"
    reached: set[Path] = set()
    todo = [docs / "index.md"]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        todo += [p for p in _linked_pages(page) if p.suffix == ".md" and p.is_relative_to(docs)]
    assert sorted(str(p.relative_to(ROOT)) for p in set(docs.rglob("*.md")) - reached) == []


def test_every_howto_page_is_listed_in_the_index_and_the_readme() -> None:
    howtos = {page.resolve() for page in (ROOT / "docs" / "howto").glob("*.md")}
    for listing in (ROOT / "docs" / "index.md", ROOT / "README.md"):
        missing = howtos - _linked_pages(listing)
        assert sorted(page.name for page in missing) == [], listing.name


def _map_rows() -> dict[str, str]:
    """CONTRIBUTING.md's module map: first cell (a module, or a package ending in ``/``) -> row."""
    text = (ROOT / "CONTRIBUTING.md").read_text().split("One line per module", 1)[1]
    rows = {}
    for line in text.split("\n## ", 1)[0].splitlines():
        cells = line.split("|")
        if len(cells) > 3:
            for name in re.findall(r"`([^`]+)`", cells[1]):
                rows[name] = line
    return rows


def _named_in_map(module: str, rows: dict[str, str]) -> bool:
    """``module`` (a path under ``spanner_queues/``) has its own row, shares one (``a.py``,
    ``b.py``), or is named (``b.py`` or ``b``) in the row of a package holding it."""
    parts = module.split("/")
    if module in rows or (
        module.endswith("/__init__.py") and module[: -len("__init__.py")] in rows
    ):
        return True
    if any(
        line.startswith(f"| `{'/'.join(parts[:-1])}/") and f"`{parts[-1]}`" in line
        for line in rows.values()
    ):
        return True
    for depth in range(len(parts) - 1, 0, -1):
        package = "/".join(parts[:depth]) + "/"
        if package in rows:
            rest = "/".join(parts[depth:])
            names = {
                module,
                rest,
                rest.removesuffix(".py"),
                parts[-1],
                parts[-1].removesuffix(".py"),
            }
            return any(f"`{name}`" in rows[package] for name in names)
    return False


def test_contributing_map_names_every_module() -> None:
    package = ROOT / "spanner_queues"
    modules = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if "migrations" not in path.parts and path.name != "__init__.py"
    ]
    rows = _map_rows()
    assert [module for module in modules if not _named_in_map(module, rows)] == []


def test_contributing_map_states_the_layers_each_module_imports() -> None:
    """The map's "imports (layer)" column is the set of layers the module (or package, its own
    modules left out) imports at run time, per ``tests/test_import_graph.py``."""
    from tests.test_import_graph import PACKAGE, _layer_of, _layers, import_graph

    graph, layers, wrong, seen = import_graph(), _layers(), [], set()
    for line in _map_rows().values():
        cells = line.split("|")
        if line in seen or "anything" in cells[3] or cells[3].strip() == "testing":
            continue
        seen.add(line)
        first = re.findall(r"`([^`]+)`", cells[1])[0]
        name = f"{PACKAGE}." + first.removesuffix(".py").removesuffix("/").replace("/", ".")
        name = name.removesuffix(".__init__")
        own = [m for m in graph if m == name or (first.endswith("/") and m.startswith(name + "."))]
        targets = {t for m in own for t in graph[m] if t not in own}
        found = {_layer_of(t, layers) for t in targets} - {None}
        named = {
            f"{PACKAGE}." + n.strip("/").replace("/", ".")
            for n in re.findall(r"`([^`]+)`", cells[3])
        }
        stated = {int(d) for d in re.findall(r"\b[1-7]\b", cells[3])} | (
            {_layer_of(n, layers) for n in named} - {None}
        )
        if found != stated:
            wrong.append(f"{first}: map says {sorted(stated)}, imports {sorted(found)}")
    assert wrong == []
