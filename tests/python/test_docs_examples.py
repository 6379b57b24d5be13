"""The examples in README.md and docs/*.md run as written.

* The README's "Using it" Python block is executed.
* Every `dynacp ...` / `python3 -m dynacp ...` command line in a code block of README.md or docs/*.md is run
  (in-process through ``dynacp.cli.main``, from a scratch directory that sees the repository's ``examples/``), and
  must exit 0. ``> FILE`` redirects stdout as a shell would. Other commands in the docs (builds, benchmarks, fuzzers,
  torchrun) are not CLI examples of dynacp and are not run here.
* The table the README shows under "What you get" is what ``dynacp compare`` prints (all but the measured solve
  times, which depend on the machine).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import List, Tuple

import pytest

from dynacp.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def code_blocks(path: Path) -> List[Tuple[str, str]]:
    """(language, text) of every fenced code block of a Markdown file."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", path.read_text(), re.S | re.M)]


def cli_examples() -> List[Tuple[str, str]]:
    """(file, command) for every dynacp command line in the docs' code blocks (continuations joined; in ```text
    transcripts only the lines after a "$ " prompt)."""
    found = []
    for path in DOCS:
        for lang, text in code_blocks(path):
            text = text.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("$ "):
                    line = line[2:]
                elif lang == "text":  # a transcript: only its "$ " lines are commands, the rest is output
                    continue
                for part in line.split("&&"):
                    part = part.strip()
                    if part.startswith("dynacp ") or part.startswith("python3 -m dynacp"):
                        found.append((path.name, part))
    return found


EXAMPLES = cli_examples()


def test_the_docs_have_cli_examples() -> None:
    files = {f for f, _ in EXAMPLES}
    assert {"README.md", "planner.md"} <= files
    commands = {c.split()[1] if c.startswith("dynacp") else c.split()[3] for _, c in EXAMPLES}
    assert {"compare", "plan", "report", "configs", "--version"} <= commands


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_line(command: str) -> Tuple[int, str]:
    """Runs one documented command line; returns (exit status, stdout)."""
    argv = shlex.split(command, comments=True)
    if argv[:3] == ["python3", "-m", "dynacp"]:
        argv = argv[3:]
    else:
        assert argv[0] == "dynacp"
        argv = argv[1:]
    redirect = None
    if ">" in argv:
        i = argv.index(">")
        argv, redirect = argv[:i], argv[i + 1]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # --version, --help
            rc = int(e.code or 0)
    if redirect:
        Path(redirect).write_text(out.getvalue())
    return rc, out.getvalue()


@pytest.mark.parametrize("where, command", EXAMPLES, ids=[f"{f}:{c[:60]}" for f, c in EXAMPLES])
def test_cli_example_runs(where, command, scratch) -> None:
    rc, _ = run_line(command)
    assert rc == 0, f"{where}: `{command}` exited {rc}"
    for token in shlex.split(command, comments=True):
        if token.endswith((".png", ".html", ".json")) and not token.startswith("-"):
            assert (scratch / token).stat().st_size > 0, f"{where}: `{command}` did not write {token}"


def test_readme_using_it_block_runs_as_written(scratch) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Using it"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "tokens_per_rank=" in block
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md:Using it", "exec"), {})
    import json

    import dynacp

    doc = json.loads((scratch / "plan.json").read_text())
    assert doc["strategy"] == "dynacp" and dynacp.Plan.from_dict(doc).predicted.step_time > 0
    assert out.getvalue().count("\n") > 3


def test_readme_table_is_what_compare_prints(scratch) -> None:
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"```text\n\$ dynacp compare[^\n]*\n(.*?)```", readme, re.S).group(1).splitlines()
    rc, printed = run_line("dynacp compare")
    printed_lines = printed.splitlines()
    assert rc == 0 and len(shown) == len(printed_lines)
    for a, b in zip(shown, printed_lines):
        if re.match(r"^\w+ +\d", a):  # a strategy row: all but the last column (solve ms, measured)
            assert a.split()[:-1] == b.split()[:-1]
        else:
            assert a == b
