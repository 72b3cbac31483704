#!/usr/bin/env python3
"""Check that the docs and the code's Notes point at things that exist.

    python tools/check_docs.py [--root DIR]

Prints one ``file:line: kind: message`` per finding and exits 1 if there is
any. The checks:

* ``path``: a repository path in backticks in ``README.md`` or ``docs/*.md``
  (``torch/csrc/...``, ``aliasguard/...``, ``bench/...``, ``tools/...``,
  ``cmake/...``, ``test/...``, ...; brace forms such as
  ``track_views.{h,cpp}`` stand for every expansion, globs for at least one
  match) that does not exist. In the file table of ``docs/architecture.md``
  every name in the first column is checked, a bare name relative to the
  folder of the path before it in the same cell. Paths of PyTorch's own tree
  (a table column headed "upstream", or a span right after the word
  "upstream") are not this repository's and are skipped.
* ``note``: a ``Note [Name]`` pointer in a ``.cpp``/``.h``/``.py``/``.md``
  file that names a Note defined nowhere. A definition is a line
  ``// Note [Name]`` or ``# Note [Name]`` whose next line is a ``~~~``
  underline.
* ``note-file``: in the docs, "``Note [Name]`` in ``some/file``" where
  ``some/file`` does not hold that Note's definition.
* ``link``: a markdown link ``[text](relative/path)`` to a missing file, or
  to a heading anchor (``file.md#anchor``, ``#anchor``) that no heading of
  the target produces.
* ``tracker``: a tracked text file that mentions a tracker number (the word
  issue followed by a number).

``build*`` and ``.venv*`` folders are never read.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

# The first folder of a path this repository has.
REPO_TOP_DIRS = ("torch", "aliasguard", "bench", "tools", "cmake", "test", "c10", "aten", "docs", ".ci")
SOURCE_SUFFIXES = (".cpp", ".h", ".py", ".md")
ARCHITECTURE = "docs/architecture.md"
# The checker and its test spell out Note pointers as examples.
NOTE_EXAMPLE_FILES = ("tools/check_docs.py", "test/python/test_docs.py")

# Spelled with a character class so that this file does not match itself.
TRACKER_RE = re.compile(r"\bissu[e] [0-9]+\b", re.IGNORECASE)
SPAN_RE = re.compile(r"`([^`\n]+)`")
PATH_RE = re.compile(r"^(?:\./)?(?:%s)/[\w./{},*+-]*$" % "|".join(re.escape(d) for d in REPO_TOP_DIRS))
NOTE_DEF_RE = re.compile(r"^\s*(?://|#)\s*Note \[([^\]]+)\]\s*$")
UNDERLINE_RE = re.compile(r"^\s*(?://|#)\s*~{3,}\s*$")
# A Note name may be wrapped over comment lines: "See Note [Eager dispatch\n// inside a trace]".
NOTE_REF_RE = re.compile(r"Note \[([^\]]+)\]")
NOTE_IN_FILE_RE = re.compile(r"Note \[([^\]]+)\]`?\s+in\s+`([^`]+)`")
LINK_RE = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE_RE = re.compile(r"^\s*```")


@dataclass(frozen=True, order=True)
class Finding:
    path: str  # relative to the root, with "/"
    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.message}"


def _skipped_dir(name: str) -> bool:
    return name == ".git" or name.startswith("build") or name.startswith(".venv")


def walk_files(root: Path, suffixes: Tuple[str, ...]) -> Iterator[Path]:
    """Files under ``root`` with one of ``suffixes``, outside ``.git``, ``build*``, ``.venv*``."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _skipped_dir(d))
        for name in sorted(filenames):
            if name.endswith(suffixes):
                yield Path(dirpath) / name


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def expand_braces(text: str) -> List[str]:
    """``a.{h,cpp}`` -> ``["a.h", "a.cpp"]``; several brace groups multiply."""
    parts = re.split(r"(\{[^{}]*\})", text)
    choices = [p[1:-1].split(",") if p.startswith("{") and p.endswith("}") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _doc_files(root: Path) -> List[Path]:
    docs = sorted((root / "docs").glob("*.md")) if (root / "docs").is_dir() else []
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + docs


def _exists(root: Path, rel: str) -> bool:
    if any(c in rel for c in "*?["):
        return bool(glob.glob(str(root / rel)))
    return (root / rel).exists()


def _clean_token(token: str) -> str:
    token = token.strip().rstrip(".,;:)")
    token = re.sub(r"::.*$", "", token)  # pytest node ids
    token = re.sub(r":\d+$", "", token)  # file:line
    return token


def _table_cells(line: str) -> Optional[List[str]]:
    stripped = line.strip()
    if not (stripped.startswith("|") and stripped.endswith("|")):
        return None
    return [c.strip() for c in stripped[1:-1].split("|")]


def _lines_outside_fences(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block)."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE_RE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def check_paths(root: Path) -> List[Finding]:
    findings: List[Finding] = []
    for doc in _doc_files(root):
        text = _read(doc) or ""
        rel_doc = _rel(root, doc)
        upstream_columns: Set[int] = set()
        in_file_table = False
        for number, line, fenced in _lines_outside_fences(text):
            if fenced:
                continue
            cells = _table_cells(line)
            if cells is None:
                upstream_columns = set()
                in_file_table = False
            elif all(re.fullmatch(r":?-+:?", c) for c in cells if c):
                continue  # the separator row
            elif not upstream_columns and not in_file_table and "`" not in line:
                # A header row.
                upstream_columns = {i for i, c in enumerate(cells) if "upstream" in c.lower()}
                in_file_table = rel_doc == ARCHITECTURE and cells[0].lower() == "file"
                continue
            segments: List[Tuple[int, str]]
            if cells is not None:
                segments = [(i, c) for i, c in enumerate(cells) if i not in upstream_columns]
            else:
                segments = [(-1, line)]
            for column, segment in segments:
                previous_dir = ""
                for match in SPAN_RE.finditer(segment):
                    before = segment[: match.start()].rstrip()
                    if re.search(r"upstream(?:'s)?$", before, re.IGNORECASE):
                        continue
                    for word in match.group(1).split():
                        token = _clean_token(word)
                        first_column_file = in_file_table and column == 0
                        if not PATH_RE.match(token) and not (first_column_file and re.fullmatch(r"[\w.{},-]+", token)):
                            continue
                        for candidate in expand_braces(token):
                            if "/" in candidate:
                                found = _exists(root, candidate)
                                previous_dir = candidate.rsplit("/", 1)[0]
                            else:
                                found = _exists(root, candidate) or (
                                    bool(previous_dir) and _exists(root, f"{previous_dir}/{candidate}")
                                )
                            if not found:
                                findings.append(
                                    Finding(rel_doc, number, "path", f"`{candidate}` does not exist (from `{word}`)")
                                )
    return findings


def _normalize_note_name(name: str) -> str:
    # Join a name split over two C++ string literals ("... Note [Operator "
    # "of an OpOverload] ..."), then one wrapped over comment lines.
    name = re.sub(r'"\s*\n\s*"', "", name)
    return re.sub(r"\s*\n\s*(?://+|#+|\*+)?\s*", " ", name).strip()


def note_definitions(root: Path) -> Dict[str, List[str]]:
    """Note name -> the files (relative) that define it."""
    defined: Dict[str, List[str]] = {}
    for path in walk_files(root, SOURCE_SUFFIXES):
        text = _read(path)
        if text is None or "Note [" not in text:
            continue
        lines = text.split("\n")
        for i, line in enumerate(lines[:-1]):
            m = NOTE_DEF_RE.match(line)
            if m and UNDERLINE_RE.match(lines[i + 1]):
                defined.setdefault(m.group(1).strip(), []).append(_rel(root, path))
    return defined


def check_notes(root: Path, defined: Optional[Dict[str, List[str]]] = None) -> List[Finding]:
    if defined is None:
        defined = note_definitions(root)
    findings: List[Finding] = []
    for path in walk_files(root, SOURCE_SUFFIXES):
        text = _read(path)
        if text is None or "Note [" not in text:
            continue
        rel = _rel(root, path)
        if rel in NOTE_EXAMPLE_FILES:
            continue
        lines = text.split("\n")
        for m in NOTE_REF_RE.finditer(text):
            number = _line_of(text, m.start())
            line = lines[number - 1]
            next_line = lines[number] if number < len(lines) else ""
            if NOTE_DEF_RE.match(line) and UNDERLINE_RE.match(next_line):
                continue  # the definition itself
            name = _normalize_note_name(m.group(1))
            if name not in defined:
                findings.append(Finding(rel, number, "note", f"Note [{name}] is not defined anywhere"))
        if path.suffix == ".md":
            for m in NOTE_IN_FILE_RE.finditer(text):
                name = _normalize_note_name(m.group(1))
                target = _clean_token(m.group(2))
                homes = defined.get(name)
                if homes is None:
                    continue  # reported above
                candidates = expand_braces(target)
                if not any(c in homes for c in candidates):
                    findings.append(
                        Finding(
                            rel,
                            _line_of(text, m.start()),
                            "note-file",
                            f"Note [{name}] is not defined in `{target}` but in {', '.join(f'`{h}`' for h in homes)}",
                        )
                    )
    return findings


def heading_anchors(text: str) -> Set[str]:
    """The anchors GitHub gives the headings of a markdown text."""
    anchors: Set[str] = set()
    seen: Dict[str, int] = {}
    for _, line, fenced in _lines_outside_fences(text):
        if fenced:
            continue
        m = HEADING_RE.match(line)
        if not m:
            continue
        slug = m.group(2).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", slug)
        slug = slug.replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def check_links(root: Path) -> List[Finding]:
    findings: List[Finding] = []
    for path in walk_files(root, (".md",)):
        text = _read(path)
        if text is None:
            continue
        rel = _rel(root, path)
        for number, line, fenced in _lines_outside_fences(text):
            if fenced:
                continue
            for m in LINK_RE.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                    continue  # http:, https:, mailto:, ...
                file_part, _, anchor = target.partition("#")
                resolved = (path.parent / file_part).resolve() if file_part else path.resolve()
                if not resolved.exists():
                    findings.append(Finding(rel, number, "link", f"`{target}`: `{file_part}` does not exist"))
                    continue
                if anchor and resolved.suffix == ".md" and resolved.is_file():
                    if anchor not in heading_anchors(_read(resolved) or ""):
                        findings.append(Finding(rel, number, "link", f"`{target}`: no heading gives `#{anchor}`"))
    return findings


def tracked_files(root: Path) -> List[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z"], check=True, capture_output=True
        ).stdout.decode("utf-8", "surrogateescape")
    except (OSError, subprocess.CalledProcessError):
        return list(walk_files(root, ("",)))
    return [root / name for name in out.split("\0") if name]


def check_tracker_numbers(root: Path, files: Optional[Iterable[Path]] = None) -> List[Finding]:
    findings: List[Finding] = []
    for path in tracked_files(root) if files is None else files:
        if not path.is_file() or any(_skipped_dir(p) for p in path.relative_to(root).parts[:-1]):
            continue
        text = _read(path)
        if text is None or "\0" in text:
            continue  # binary
        for m in TRACKER_RE.finditer(text):
            findings.append(
                Finding(_rel(root, path), _line_of(text, m.start()), "tracker", f"tracker number {m.group(0)!r}")
            )
    return findings


def check_all(root: Path) -> List[Finding]:
    root = root.resolve()
    return sorted(check_paths(root) + check_notes(root) + check_links(root) + check_tracker_numbers(root))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    findings = check_all(args.root)
    for finding in findings:
        print(finding)
    print(f"check_docs: {len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
