#!/usr/bin/env python3
"""ctest `layering`: every #include in src/, io/, kernels/ and include/ against the dependency
rule, the table of docs/architecture.md ("Dependency rule").

A file's module is the table row its repository path falls under (a folder such as
"src/comm", or a public header as it is included, "zoe/ranks.hpp" for include/zoe/ranks.hpp).
An include of another module must be in the file's own row: the direct edges, where the build
(cmake/ZoeLayering.cmake) can only enforce what a module reaches. Each failure names file:line
and the edge. Also fails on a table the build would read differently (--cmake-table: the rows
as CMake parsed them), a row naming nothing, an edge to a row below it, a source folder or
public header without a row, and an include not written by repository path.

Usage: check_layering.py --root <repository> [--cmake-table <file>]
Exit status 0 when every include keeps the rule, 1 otherwise (each failure on stderr).
"""
import argparse
import os
import re
import sys

TABLE_DOC = "docs/architecture.md"
DOORS_SECTION = "## Doors inside a module"
SCANNED = ("src", "io", "kernels", "include")
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
ROW = re.compile(r"^\| *`([^`]+)` *\|([^|]*)\|")


def read_table(root):
    """The rows of the section "Dependency rule": [(module, [deps], line number)], in order."""
    path = os.path.join(root, TABLE_DOC)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        start = lines.index("## Dependency rule")
    except ValueError:
        sys.exit(f"{TABLE_DOC}: no section '## Dependency rule' (the layering table)")
    rows = []
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), re.findall(r"`([^`]+)`", m.group(2)), number))
    if not rows:
        sys.exit(f"{TABLE_DOC}: the section 'Dependency rule' has no table rows")
    return rows


def read_doors(root):
    """The rows of the section "Doors inside a module": [(folder, [forbidden headers], line)]."""
    with open(os.path.join(root, TABLE_DOC), encoding="utf-8") as f:
        lines = f.read().split("\n")
    if DOORS_SECTION not in lines:
        return []
    rows = []
    for number, line in enumerate(lines[lines.index(DOORS_SECTION) + 1:], lines.index(DOORS_SECTION) + 2):
        if line.startswith("## "):
            break
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), re.findall(r"`([^`]+)`", m.group(2)), number))
    return rows


def check_doors(root, doors, errors):
    """No file under a door's folder includes a header the door forbids."""
    for folder, forbidden, number in doors:
        if not os.path.isdir(os.path.join(root, folder)):
            errors.append(f"{TABLE_DOC}:{number}: door `{folder}` names no folder")
            continue
        for rel in scanned_files(root):
            if not rel.startswith(folder + "/"):
                continue
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                for line_number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m and m.group(2) in forbidden:
                        errors.append(f"{rel}:{line_number}: {folder} must not include {m.group(2)} "
                                      f"({TABLE_DOC}, \"{DOORS_SECTION[3:]}\")")


def source_path(root, module):
    """Where a module (or an include spelling) lives in the repository."""
    return os.path.join(root, "include", module) if module.startswith("zoe/") else os.path.join(root, module)


def module_of(spelling, modules):
    """The module an include spelling (or a repository path under include/ stripped) falls
    under: the longest row that equals it or is a folder above it; None if none."""
    best = None
    for m in modules:
        if (spelling == m or spelling.startswith(m + "/")) and (best is None or len(m) > len(best)):
            best = m
    return best


def check_table(root, rows, errors):
    seen = set()
    for module, deps, number in rows:
        where = f"{TABLE_DOC}:{number}"
        if module in seen:
            errors.append(f"{where}: module `{module}` has a second row")
        if not os.path.exists(source_path(root, module)):
            errors.append(f"{where}: module `{module}` names no file or folder")
        for dep in deps:
            if dep not in seen:
                errors.append(f"{where}: `{module}` may include `{dep}`, which is no row above it "
                              "(rows come lowest first, so the rule has no cycle)")
        seen.add(module)


def check_cmake_copy(path, rows, errors):
    """The rows as CMake parsed them ("module: dep dep" per line) must be the ones read here."""
    with open(path, encoding="utf-8") as f:
        cmake_rows = [line.rstrip("\n") for line in f if line.strip()]
    ours = [f"{module}: {' '.join(deps)}".rstrip() for module, deps, _ in rows]
    if cmake_rows != ours:
        errors.append(f"{path}: CMake read the table of {TABLE_DOC} differently (reconfigure, or fix "
                      f"the table's format):\n  cmake: {cmake_rows}\n  here:  {ours}")


def scanned_files(root):
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(SOURCE_SUFFIXES):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, root)


def check_includes(root, rows, errors):
    modules = [module for module, _, _ in rows]
    allowed = {module: set(deps) for module, deps, _ in rows}
    top_folders = {name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name))} | {"zoe"}
    count = 0
    files = list(scanned_files(root))
    for rel in files:
        spelled = rel[len("include/"):] if rel.startswith("include/") else rel
        own = module_of(spelled, modules)
        if own is None:
            errors.append(f"{rel}: no row of the dependency rule ({TABLE_DOC}) covers this file")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                quote, spelling = m.groups()
                target = module_of(spelling, modules)
                if target is None:
                    beside = os.path.join(root, os.path.dirname(rel), spelling)
                    if spelling.split("/")[0] in top_folders:
                        errors.append(f"{rel}:{number}: includes \"{spelling}\", which no row of the "
                                      f"dependency rule covers")
                    elif quote == '"' and os.path.exists(beside):
                        errors.append(f"{rel}:{number}: includes \"{spelling}\" relative to its folder; "
                                      "write the repository path")
                    continue  # a system or third-party header
                count += 1
                if target != own and target not in allowed[own]:
                    errors.append(f"{rel}:{number}: {own} -> {target} is not in the dependency rule "
                                  f"({TABLE_DOC}): {line.strip()}")
    return len(files), count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the repository")
    parser.add_argument("--cmake-table", help="the rows as CMake read them (build dir)")
    args = parser.parse_args()
    rows = read_table(args.root)
    errors = []
    check_table(args.root, rows, errors)
    if args.cmake_table:
        check_cmake_copy(args.cmake_table, rows, errors)
    files, includes = check_includes(args.root, rows, errors)
    doors = read_doors(args.root)
    check_doors(args.root, doors, errors)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"layering: {len(errors)} violation(s) of the dependency rule", file=sys.stderr)
        return 1
    print(f"layering: {includes} includes of zoe's modules in {files} files keep the {len(rows)} rows "
          f"of {TABLE_DOC} and its {len(doors)} door(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
