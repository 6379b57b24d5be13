"""docs/architecture.md stays true to the tree: every repository path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: A code span that names a repository path: starts at one of the tree's top folders (or is a top-level file).
PATH = re.compile(r"`((?:include|src|bindings|python|tests|docs|benchmarks|tools|examples|scripts)/[^`\s]*"
                  r"|README\.md)`")


def named_paths(text: str) -> list[str]:
    """The repository paths named in code spans of ``text``, in order."""
    return [m.group(1) for m in PATH.finditer(text)]


def test_every_path_the_architecture_page_names_exists() -> None:
    paths = named_paths(DOC.read_text())
    assert len(paths) > 40  # the page is a map: it names the folders and files
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == []


def test_the_path_check_sees_a_missing_path() -> None:
    assert named_paths("see `src/solve/nowhere.cpp` and `README.md`, not `dynacp.plan`") == [
        "src/solve/nowhere.cpp", "README.md"]
    assert not (ROOT / "src/solve/nowhere.cpp").exists()
