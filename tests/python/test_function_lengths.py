"""The solver's size rule (docs/development.md, "Size"): no function over 80 lines, no file over 500 in src/solve/."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import function_lengths as fl  # noqa: E402


def test_src_solve_keeps_to_the_size_limits() -> None:
    files = fl.sources([str(ROOT / "src" / "solve")])
    assert len(files) > 40
    assert fl.over_limits([str(ROOT / "src" / "solve")], max_function=80, max_file=500) == []


def test_functions_are_measured_from_signature_to_closing_brace(tmp_path) -> None:
    src = tmp_path / "a.cpp"
    src.write_text(
        "namespace x {\n"                       # 1
        "struct S { int f() const { return 1; } };\n"  # 2: a member function of one line
        "// a comment with a brace {\n"          # 3
        "int g(int a,\n"                         # 4
        "      int b) {\n"                       # 5
        "  auto h = [&](int c) { return c; };\n"  # 6: a lambda counts towards g
        "  const char* s = \"}\";\n"             # 7
        "  return h(a) + b;\n"                   # 8
        "}\n"                                    # 9
        "int v[] = {1, 2};\n"                    # 10: an initialiser, not a function
        "}  // namespace x\n")
    got = [(f.line, f.lines) for f in fl.functions(src)]
    assert got == [(2, 1), (4, 6)]
    assert fl.over_limits([str(src)], max_function=5, max_file=500) == [f"{src}:4: 6 lines: int g(int a, int b)"]
    assert fl.over_limits([str(src)], max_function=6, max_file=10) == [f"{src}: 11 lines (file)"]
