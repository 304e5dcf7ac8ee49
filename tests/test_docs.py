"""docs/ stays a guide: each docs/*.md page is present-tense reference, at most MAX_LINES lines and carrying no
date; what was measured when lives in docs/notes/ (every notes page indexed and dated); every relative link in
README.md and docs/ reaches an existing file, and the heading its #anchor names; every file path a page names exists.

The checkers are plain functions run on made-up text first, so a test shows each of them catching what it is for.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTES = DOCS / "notes"
MAX_LINES = 400

GUIDE = sorted(DOCS.glob("*.md"))
NOTE_PAGES = sorted(p for p in NOTES.glob("*.md") if p.name != "README.md")
LINKED = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

# What dates a line: an ISO date, a month with a year, a time of day in UTC, or a run told as "this session".
MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sept?(?:ember)?|Oct(?:ober)?"
    r"|Nov(?:ember)?|Dec(?:ember)?)"
)
DATED = [
    re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    re.compile(rf"\b{MONTH}\.? (?:\d{{1,2}}, )?(?:19|20)\d\d\b"),
    re.compile(r"\b\d{1,2}:\d\d(?:-\d{1,2}:\d\d)? UTC\b"),
    re.compile(r"\bthis (?:session|sitting)\b", re.IGNORECASE),
]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
# A path inside the repository, as pages name them: `specdec/model/fast/kernels.py`, tests/test_docs.py, ... (a
# docs/ page by its .md name is a link's business: other projects' docs/*.md are named in docs/engines.md)
PATH = re.compile(
    r"(?<![\w./-])((?:specdec|tests|scripts|notebooks|heads)/[\w./-]*\w\.(?:py|md|json|ipynb|png|txt)"
    r"|docs/[\w./-]*\w\.(?:py|json|png|txt))\b"
)


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def link_targets(line: str) -> list[str]:
    """The targets of a line's markdown links and images; inline code spans hold none."""
    return LINK.findall(re.sub(r"`[^`]*`", "", line))


def dated_lines(text: str) -> list[int]:
    """The numbers of the lines that carry a date, code included (a command dated in a comment is dated)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if any(d.search(line) for d in DATED)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in outside_fences(text):  # a heading's `code` counts in its anchor
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """'line N: target (why)' for each relative link of `page` (holding `text`) that reaches nothing."""
    out = []
    for number, line in outside_fences(text):
        for target in link_targets(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = unquote(target).partition("#")
            if file_part.startswith("/"):
                dest = root / file_part.lstrip("/")
            else:
                dest = (page.parent / file_part) if file_part else page
            if not dest.exists():
                out.append(f"line {number}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                dest_text = text if dest == page else dest.read_text(encoding="utf-8")
                if anchor not in anchors(dest_text):
                    out.append(f"line {number}: {target} (no heading with that anchor)")
    return out


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """Paths inside the repository a page names (in code or prose) that do not exist."""
    return sorted({p for p in PATH.findall(text) if not (root / p).exists()})


# The checkers, on made-up text.


def test_a_dated_line_is_caught_and_an_undated_one_is_not():
    text = "\n".join(
        [
            "Measured on 2026-11-27 with two cores.",  # 1
            "A step takes 40 ms on a 2-vCPU VM.",  # 2
            "As measured in November 2026, it drafts.",  # 3
            "The suite ran 11:17-11:44 UTC, idle.",  # 4
            "Read the figures of this session with care.",  # 5
            "r(5) is 1.3; ICLR 2025 (arXiv 2403.10444) proves it.",  # 6
            "Step 16:08 of 20:00 is not a time of day without UTC; 2026 alone is a year in a citation.",  # 7
            "Released Nov. 5, 2024.",  # 8
        ]
    )
    assert dated_lines(text) == [1, 3, 4, 5, 8]


def test_github_anchors():
    assert slug("OpenBLAS's idle threads, and the pass after") == "openblass-idle-threads-and-the-pass-after"
    race = "The race: what `python -m specdec` prints, and why"
    assert slug(race) == "the-race-what-python--m-specdec-prints-and-why"
    assert slug("EAGLE-3, started from the EAGLE head") == "eagle-3-started-from-the-eagle-head"
    assert slug("See [the notes](notes/README.md) first") == "see-the-notes-first"
    assert anchors("# A\n## Tests\n```\n## Not a heading\n```\n## Tests\n") == {"a", "tests", "tests-1"}


def test_a_broken_link_is_caught_and_a_good_one_is_not(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Its section\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = "\n".join(
        [
            "# Page",  # 1
            "[fine](other.md) and [fine too](other.md#its-section) and [here](#page)",  # 2
            "[gone](missing.md)",  # 3
            "[wrong anchor](other.md#no-such-section)",  # 4
            "[own anchor, wrong](#nowhere) and ![an image](missing.png)",  # 5
            "[web](https://example.org/x.md) is not checked; neither is `[code](nowhere.md)`",  # 6
            "```",
            "[inside a code block](nowhere.md)",
            "```",
        ]
    )
    page.write_text(text, encoding="utf-8")
    assert broken_links(page, text, root=tmp_path) == [
        "line 3: missing.md (no such file)",
        "line 4: other.md#no-such-section (no heading with that anchor)",
        "line 5: #nowhere (no heading with that anchor)",
        "line 5: missing.png (no such file)",
    ]


def test_a_missing_path_is_caught(tmp_path):
    (tmp_path / "specdec" / "model").mkdir(parents=True)
    (tmp_path / "specdec" / "model" / "linear.py").write_text("", encoding="utf-8")
    text = (
        "`specdec/model/linear.py` reads as math; specdec/model/kernels.py moved; see tests/test_x.py and"
        " docs/plot.py; vLLM's docs/usage/metrics.md is theirs, and ../shared/tools/x.py outside the repository."
    )
    assert missing_paths(text, root=tmp_path) == ["docs/plot.py", "specdec/model/kernels.py", "tests/test_x.py"]


# The pages themselves.


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.name)
def test_a_guide_page_is_at_most_400_lines(page):
    n = len(page.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"docs/{page.name} has {n} lines (at most {MAX_LINES}): move measurement logs to docs/notes/"


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.name)
def test_a_guide_page_carries_no_date(page):
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    dated = [f"line {n}: {lines[n - 1].strip()[:100]}" for n in dated_lines(text)]
    assert not dated, f"docs/{page.name} is dated (move these to a docs/notes/ page):\n" + "\n".join(dated)


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_anchor(page):
    broken = broken_links(page, page.read_text(encoding="utf-8"))
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


# docs/reading.md is checked function by function by tests/test_reading.py.
@pytest.mark.parametrize(
    "page", [p for p in sorted(DOCS.rglob("*.md")) if p.name != "reading.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_path_a_page_names_exists(page):
    missing = missing_paths(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_notes_page_is_indexed_and_dated():
    assert NOTE_PAGES, "docs/notes/ holds no notes"
    index = (NOTES / "README.md").read_text(encoding="utf-8")
    linked = {Path(t.partition("#")[0]).name for _, line in outside_fences(index) for t in link_targets(line)}
    for page in NOTE_PAGES:
        assert page.name in linked, f"docs/notes/README.md does not list {page.name}"
        assert dated_lines(page.read_text(encoding="utf-8")), f"docs/notes/{page.name} gives no date"


# The README: a front door, not a manual.

README_MAX_LINES = 200
COMMAND_MAX = 120


def front_door_problems(text: str) -> list[str]:
    """What keeps a README from being a front door: over README_MAX_LINES lines; a first code block that is not
    two commands (install and run; test) of at most COMMAND_MAX characters each, the test one `python -m pytest`;
    a word about how the work was organised (issues, tickets, sessions)."""
    problems, lines = [], text.splitlines()
    if len(lines) > README_MAX_LINES:
        problems.append(f"{len(lines)} lines, over {README_MAX_LINES}: move depth to docs/")
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    commands = [line.split("  #")[0].strip() for line in (blocks[0] if blocks else "").splitlines() if line.strip()]
    if len(commands) != 2 or not commands[1].startswith("python -m pytest"):
        problems.append(f"the first code block should be install-and-run, then the test command; it is {commands}")
    problems += [f"a command of {len(c)} characters: {c[:60]}..." for c in commands if len(c) > COMMAND_MAX]
    problems += [f"line {n}: {line.strip()[:80]}" for n, line in enumerate(lines, 1) if ORGANISED.search(line)]
    return problems


ORGANISED = re.compile(r"\b(issues?|tickets?|this session|sprint)\b", re.IGNORECASE)


def test_the_front_door_check_catches_each_problem():
    good = "# x\n\n```bash\npip install -e . && x   # install and run\npython -m pytest   # test\n```\n"
    assert front_door_problems(good) == []
    assert front_door_problems(good + "text\n" * 200)  # too long
    assert front_door_problems(good.replace("python -m pytest", "make test"))  # no test command
    assert front_door_problems(good.replace("x   #", "x " + "--flag " * 20 + "  #"))  # a long command
    assert front_door_problems(good + "Fixed in issue 12.\n")  # how the work was organised


def test_the_readme_is_a_front_door_and_ci_runs_its_test_command():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert front_door_problems(text) == []
    block = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)[0]
    assert block.splitlines()[1].split("  #")[0].strip() == "python -m pytest"  # the suite CI runs first:
    assert '\n"$venv/bin/python" -m pytest\n' in (ROOT / ".ci" / "run").read_text()
