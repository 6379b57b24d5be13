#!/usr/bin/env python3
"""Lines per C++ function and per file: the size check of the solver (docs/development.md, "Size").

    python3 tools/function_lengths.py src/solve                 # functions over 80 lines, files over 500
    python3 tools/function_lengths.py src/solve --top 10        # the ten longest functions
    python3 tools/function_lengths.py --max-function 120 src    # another limit

A function's length runs from the first line of its signature to its closing brace. Functions are found by
braces outside comments and literals: a block whose header (the text since the previous ``;``, ``{`` or ``}``)
holds a parameter list and is not a class, struct, union, enum or namespace; lambdas and local classes count towards
the function around them. Exit status 1 when something is over a limit.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterator, NamedTuple

SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cu", ".inc"}
_SCOPES = re.compile(r"\b(namespace|class|struct|union|enum)\b")


class Function(NamedTuple):
    path: str
    line: int  # first line of the signature (1-based)
    lines: int
    header: str


def strip(text: str) -> str:
    """``text`` with comments, string and character literals blanked (newlines kept, so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def functions(path: Path) -> Iterator[Function]:
    """Every function defined in ``path``."""
    code = strip(path.read_text())
    stack: list[tuple[str, int, str]] = []  # (kind, first line, header) of each open brace
    header_start = 0
    for i, ch in enumerate(code):
        if ch == "{":
            header = code[header_start:i]
            inside = any(kind == "function" for kind, _, _ in stack)
            is_fn = not inside and ")" in header and not _SCOPES.search(header.split("(")[0]) \
                and not header.rstrip().endswith("=")
            first = header_start + (len(header) - len(header.lstrip()))
            stack.append(("function" if is_fn else "block", code.count("\n", 0, first) + 1, " ".join(header.split())))
            header_start = i + 1
        elif ch == "}":
            if stack:
                kind, line, header = stack.pop()
                if kind == "function":
                    yield Function(str(path), line, code.count("\n", 0, i) + 1 - line + 1, header)
            header_start = i + 1
        elif ch == ";":
            header_start = i + 1


def sources(roots: list[str]) -> list[Path]:
    """The C++ files under ``roots``, sorted."""
    out: list[Path] = []
    for r in map(Path, roots):
        out += [r] if r.is_file() else [p for p in r.rglob("*") if p.suffix in SUFFIXES]
    return sorted(out)


def over_limits(roots: list[str], max_function: int = 80, max_file: int = 500) -> list[str]:
    """One line per function over ``max_function`` lines and per file over ``max_file`` lines."""
    out = []
    for p in sources(roots):
        n = p.read_text().count("\n")
        if n > max_file:
            out.append(f"{p}: {n} lines (file)")
        out += [f"{f.path}:{f.line}: {f.lines} lines: {f.header[:80]}" for f in functions(p) if f.lines > max_function]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="files or folders of C++ sources")
    ap.add_argument("--max-function", type=int, default=80, help="lines a function may have (default 80)")
    ap.add_argument("--max-file", type=int, default=500, help="lines a file may have (default 500)")
    ap.add_argument("--top", type=int, default=0, help="also list the N longest functions")
    args = ap.parse_args(argv)
    if args.top:
        every = sorted((f for p in sources(args.roots) for f in functions(p)), key=lambda f: (-f.lines, f.path, f.line))
        for f in every[:args.top]:
            print(f"{f.lines:4d}  {f.path}:{f.line}  {f.header[:90]}")
    bad = over_limits(args.roots, args.max_function, args.max_file)
    print("\n".join(bad) if bad else f"no function over {args.max_function} lines, no file over {args.max_file}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
