"""The code's form: one formatter and no way around it, modules of one idea, a short top level.

- `ruff format` (pyproject.toml's [tool.ruff]: line length 120) leaves specdec/, tests/, docs/, scripts/, img/
  and main.py as they are, and no comment switches it off for a line or a block (`fmt: skip`, `fmt: off`);
- every module of specdec/ is at most MAX_LINES lines, or its docstring's first paragraph starts with
  "One idea:" and says why the module is one;
- the top of specdec/ holds at most MAX_TOP modules besides __init__.py and __main__.py (the round and what
  it needs to be read; tooling lives in subpackages named by their trade).

Each checker is a plain function, run on made-up input first, so a test shows it catching what it is for.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdec"
FORMATTED = ["specdec", "tests", "docs", "scripts", "img", "main.py"]  # what `ruff format --check` is run over
MAX_LINES = 450
MAX_TOP = 8
ONE_IDEA = "One idea:"
ESCAPE = re.compile(r"#\s*fmt:\s*(skip|off|on)\b")  # ruff's (and black's) comments that switch formatting off


def unformatted(paths: list[str], cwd: Path) -> list[str]:
    """The files among `paths` (relative to cwd) that `python -m ruff format` would change, formatted by this
    project's configuration; [] when it would change none."""
    config = ["--config", str(ROOT / "pyproject.toml"), "--no-cache", "--output-format", "concise"]
    command = [sys.executable, "-m", "ruff", "format", "--check", *config, *paths]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    if "No module named ruff" in done.stderr:
        raise AssertionError("ruff is not installed: pip install -e '.[test]' (the test extra holds it)")
    assert done.returncode in (0, 1), f"ruff format failed: {done.stderr.strip()}"  # 1: files to reformat
    named = {m.group(1) for m in re.finditer(r"^(.+?):\d+:\d+: unformatted", done.stdout, re.MULTILINE)}
    assert bool(named) == (done.returncode == 1), done.stdout  # every file it would change, named
    return sorted(named)


def escapes(source: str) -> list[int]:
    """The line numbers of comments that switch the formatter off. Comments only (read with tokenize): the
    words inside a string, as in this file, are not an escape."""
    comments = (t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT)
    return [t.start[0] for t in comments if ESCAPE.search(t.string)]


def too_long(source: str, most: int = MAX_LINES) -> str | None:
    """Why a module breaks the size rule, or None: over `most` lines without a docstring whose first paragraph
    starts with "One idea:"."""
    n_lines = len(source.splitlines())
    if n_lines <= most:
        return None
    doc = ast.get_docstring(ast.parse(source)) or ""
    if doc.split("\n\n")[0].startswith(ONE_IDEA):
        return None
    return f"{n_lines} lines, over {most}, and its docstring does not start with {ONE_IDEA!r} saying why it is one"


def crowded(package: Path, most: int = MAX_TOP) -> list[str]:
    """The modules at the top of `package` (besides __init__.py and __main__.py) when they are more than `most`."""
    modules = sorted(p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    return modules if len(modules) > most else []


def python_files() -> list[Path]:
    files = [ROOT / "main.py"]
    for folder in FORMATTED[:-1]:
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


# ---------------------------------------------------------------------------
# Each checker on made-up input: it catches what it is for, and passes what is fine.
# ---------------------------------------------------------------------------


def test_the_format_check_catches_an_unformatted_file_and_passes_a_formatted_one(tmp_path):
    (tmp_path / "messy.py").write_text("x = {  'a':1 }\n")
    (tmp_path / "tidy.py").write_text('x = {"a": 1}\n')
    assert unformatted(["messy.py", "tidy.py"], tmp_path) == ["messy.py"]
    assert unformatted(["tidy.py"], tmp_path) == []


def test_the_escape_check_finds_each_kind_of_escape_and_no_words_in_strings():
    source = (
        "a = [1,2]  # fmt: skip\n"
        "# fmt: off\n"
        "b = [1,2]\n"
        "#fmt:on\n"
        "text = '# fmt: skip is a comment ruff obeys'\n"
        "c = 1  # formatting is ruff's: fmt is not an escape\n"
    )
    assert escapes(source) == [1, 2, 4]
    assert escapes("x = 1\n") == []


def test_the_size_check_wants_one_idea_said_first():
    body = "x = 1\n" * 460
    assert too_long(body) is not None  # long, no docstring
    assert too_long('"""A module."""\n' + body) is not None
    assert too_long('"""A module.\n\nOne idea: a stream of bytes in, one model out."""\n' + body) is not None
    assert too_long('"""One idea: a stream of bytes in, one model out.\n\nMore."""\n' + body) is None
    assert too_long("x = 1\n" * MAX_LINES) is None  # at the bound


def test_the_top_level_check_counts_the_modules(tmp_path):
    for name in ["__init__.py", "__main__.py", *(f"m{i}.py" for i in range(MAX_TOP))]:
        (tmp_path / name).write_text("")
    assert crowded(tmp_path) == []  # MAX_TOP modules: allowed
    (tmp_path / "one_more.py").write_text("")
    assert len(crowded(tmp_path)) == MAX_TOP + 1


# ---------------------------------------------------------------------------
# The checks on the project.
# ---------------------------------------------------------------------------


def test_ruff_format_leaves_the_code_as_it_is():
    assert unformatted(FORMATTED, ROOT) == [], "run: python -m ruff format " + " ".join(FORMATTED)


def test_no_file_switches_the_formatter_off():
    found = {str(p.relative_to(ROOT)): lines for p in python_files() if (lines := escapes(p.read_text()))}
    assert found == {}, f"formatter escapes at {found}: write the code so that ruff format leaves it readable"


def test_every_module_is_short_or_says_it_is_one_idea():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the walk sees the package
    found = {str(p.relative_to(ROOT)): why for p in modules if (why := too_long(p.read_text()))}
    assert found == {}, found


def test_the_top_of_the_package_holds_few_modules():
    assert (PACKAGE / "speculative.py").is_file()  # the walk sees the package
    assert crowded(PACKAGE) == [], f"more than {MAX_TOP} modules at the top of specdec/: move tooling into a subpackage"
