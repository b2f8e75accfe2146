"""The pages a reader opens (README.md, docs/*.md) hold to their own rules, checked without running
anything heavy (docs/ with its subfolders): no issue numbers and no path outside the repository; every test docs/RELIABILITY.md
cites exists; every code block of docs/EXTENDING.md is a recipe a test runs; every local link and
every raw-curve file docs/RESULTS.md names exists; the README stays a five-minute page."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TESTS = ROOT / "tests"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_page_names_an_issue_number_or_a_path_outside_the_repository(page):
    text = page.read_text()
    found = [m.group(0) for m in re.finditer(r"(?i)\bissues?\s*#?\d+|\(#\d+\)|\.\./shared\b|/work/", text)]
    assert found == [], f"{rel(page)}: {found}"


def test_the_scan_catches_what_it_should():
    for bad in ("issue 39, item 10", "Issue 47's report", "issues #34", "(#12)", "python ../shared/tools/x.py"):
        assert re.search(r"(?i)\bissues?\s*#?\d+|\(#\d+\)|\.\./shared\b|/work/", bad), bad


def defined_tests() -> dict[str, str]:
    """{test file name: its source} of tests/test_*.py."""
    return {p.name: p.read_text() for p in TESTS.glob("test_*.py")}


def test_every_test_reliability_cites_exists():
    text = (ROOT / "docs" / "RELIABILITY.md").read_text()
    sources = defined_tests()
    everywhere = "\n".join(sources.values())
    missing = []
    for file, name in re.findall(r"\b(test_\w+\.py)(?:::(\w+))?", text):
        if file not in sources or (name and not re.search(rf"^\s*(async )?def {name}\b", sources[file], re.M)):
            missing.append(f"{file}::{name}" if name else file)
    cited = re.findall(r"`(test_\w+)`", text) + re.findall(r"`test_\w+\.py::(test_\w+)`", text)
    missing += [name for name in cited if not re.search(rf"^\s*def {name}\b", everywhere, re.M)]
    assert len(cited) > 50 and sorted(set(missing)) == []


def test_every_code_block_of_extending_is_a_recipe_a_test_runs():
    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    tests = "\n".join(src for name, src in defined_tests().items() if name.startswith("test_recipes"))
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) >= 7
    orphans = []
    for lang, body in blocks:
        named = re.match(r"# (\w+\.py)\n", body)
        assert lang == "python" and named, f"EXTENDING.md: a {lang or 'plain'} block that is no recipe: {body[:80]!r}"
        heading = re.findall(r"^### (.+)$", text[:text.index(body)], flags=re.M)[-1]
        if named.group(1) not in tests and f'plugin("{heading}")' not in tests:
            orphans.append(named.group(1))
    assert orphans == []


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_local_links_point_at_files_that_exist(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    missing = [t for t in targets if t and "://" not in t and not (page.parent / t).exists()]
    assert missing == [], f"{rel(page)}: {missing}"


def test_the_readme_is_short_and_keeps_its_two_fresh_machine_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    assert re.search(r"pip install -e \. && python train\.py --config digits_mutor2d\.yaml$", text, re.M)
    assert re.search(r'pip install -e "\.\[test,demo\]" && python -m pytest -q -x -rs -n 2$', text, re.M)
