#!/usr/bin/env python3
"""Checks that every relative link in the repository's markdown files resolves.

Scans every `*.md` file under the repository (skipping `target/`, `node_modules/` and
`.git/`), finds its links, inline `[text](target)` and `![alt](target)` and reference
definitions `[label]: target`, outside fenced code blocks and code spans, and for each
target that is not `http://`, `https://` or `mailto:`:

- the file or directory must exist, relative to the linking file (a target starting with
  `/` is relative to the repository root; a bare `#fragment` names the linking file);
- when the target has a `#fragment` and is a markdown file, that file must have a heading
  whose GitHub-style anchor equals the fragment: the heading's text lowercased, every
  character that is not a letter, digit, space, `-` or `_` dropped, spaces turned into
  `-`; a repeated heading gets `-1`, `-2`, ... (an HTML `id` or `name` attribute counts
  too). A fragment on any other file (`#L10` on source) is not checked.

Usage: check_links.py [--root DIR]   (exit status 1 and one `file:line: target` line per
broken link; standard library only)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import unquote

SKIPPED_DIRS = {"target", "node_modules", ".git"}
EXTERNAL = ("http://", "https://", "mailto:")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# [text](target "title"); the text may hold one level of brackets ([`keys[]`](...)).
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^<>\n]*>|\S+)")
HTML_ID = re.compile(r"<[A-Za-z][^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")


def strip_code_spans(line: str) -> str:
    """The line with every code span blanked out (same length), so that nothing inside
    backticks is read as a link."""
    out = []
    i = 0
    while i < len(line):
        if line[i] == "`":
            run = len(line) - len(line[i:].lstrip("`"))
            ticks = line[i : i + run]
            end = line.find(ticks, i + run)
            # The closing run must be exactly as long as the opening one.
            while end != -1 and end + run < len(line) and line[end + run] == "`":
                end = line.find(ticks, end + run + 1)
            if end == -1:
                out.append(ticks)
                i += run
                continue
            out.append(" " * (end + run - i))
            i = end + run
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def heading_text(raw: str) -> str:
    """A heading's text as GitHub renders it, near enough for its anchor: code spans keep
    their content, links and images their text, HTML tags and emphasis markers go."""
    text = re.sub(r"(`+)(.*?)\1", lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    # Emphasis with underscores around words (`_word_`, `__word__`); underscores inside a
    # word stay, as GitHub keeps them.
    text = re.sub(r"(?<![\w])_{1,2}(?=\S)(.+?)(?<=\S)_{1,2}(?![\w])", r"\1", text)
    return text


def slug(text: str) -> str:
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def markdown_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, with their numbers (1-based)."""
    kept = []
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            kept.append((number, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
            fence = None
    return kept


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path in cache:
        return cache[path]
    found: set[str] = set()
    used: dict[str, int] = {}

    def add(text: str) -> None:
        base = slug(heading_text(text))
        if base in used:
            used[base] += 1
            name = f"{base}-{used[base]}"
            while name in used:
                used[base] += 1
                name = f"{base}-{used[base]}"
            used[name] = 0
        else:
            used[base] = 0
            name = base
        found.add(name)

    lines = markdown_lines(path)
    previous: tuple[int, str] | None = None
    for number, line in lines:
        for m in HTML_ID.finditer(line):
            found.add(m.group(1))
        atx = ATX.match(line)
        if atx:
            text = re.sub(r"[ \t]+#+$", "", atx.group(2) or "")
            add(text)
            previous = None
            continue
        setext = SETEXT.match(line)
        if (
            setext
            and previous is not None
            and previous[0] == number - 1
            and previous[1].strip()
            and not previous[1].lstrip().startswith(("|", "-", "*", "+", ">"))
        ):
            add(previous[1].strip())
            previous = None
            continue
        previous = (number, line)
    cache[path] = found
    return found


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in markdown_lines(path):
        plain = strip_code_spans(line)
        for m in INLINE_LINK.finditer(plain):
            found.append((number, m.group(1)))
        d = REFERENCE_DEFINITION.match(plain)
        if d:
            found.append((number, d.group(1)))
    return found


def markdown_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root)
        if any(part in SKIPPED_DIRS for part in rel.parts[:-1]):
            continue
        if path.is_file():
            files.append(path)
    return files


def check(root: Path) -> tuple[list[str], int, int]:
    broken = []
    cache: dict[Path, set[str]] = {}
    files = markdown_files(root)
    count = 0
    for path in files:
        for number, raw in links(path):
            target = raw[1:-1].strip() if raw.startswith("<") and raw.endswith(">") else raw
            if not target or target.lower().startswith(EXTERNAL):
                continue
            count += 1
            file_part, _, fragment = target.partition("#")
            file_part = unquote(file_part)
            if not file_part:
                resolved = path
            elif file_part.startswith("/"):
                resolved = root / file_part.lstrip("/")
            else:
                resolved = path.parent / file_part
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not resolved.exists():
                broken.append(where)
                continue
            if fragment and resolved.is_file() and resolved.suffix.lower() == ".md":
                if unquote(fragment) not in anchors(resolved.resolve(), cache):
                    broken.append(where)
    return broken, count, len(files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    root = args.root.resolve()
    broken, count, files = check(root)
    for line in broken:
        print(line)
    if broken:
        print(f"{len(broken)} broken link(s) of {count} in {files} markdown files", file=sys.stderr)
        return 1
    print(f"{count} links in {files} markdown files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
