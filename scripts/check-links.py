#!/usr/bin/env python3
"""Checks the relative links of the repository's markdown (standard library only).

    scripts/check-links.py               # README.md, docs/**/*.md, charts/**/README.md, overrides/**/*.md, examples/**/*.md
    scripts/check-links.py FILE...       # only these files
    scripts/check-links.py --self-test   # checks the checker on a temporary tree

Every inline link `[text](target)` (images too) and every reference definition `[label]: target` outside fenced
code blocks and code spans is checked: the target file must exist (relative to the linking file; `/path` is
relative to the repository root), and a `#anchor` into a markdown file must match one of its headings' GitHub
slugs (lowercase, punctuation other than `-` and `_` removed, spaces to `-`, duplicates get `-1`, `-2`, …) or an
explicit `<a name=…>`/`id=…` anchor. A `[text][label]` whose label has no definition is reported too.
`http(s)://`, `mailto:` and other URLs with a scheme are not checked. Exit 1 with one `file:line: target (why)`
per broken link, else one line of counts.
"""

import os
import re
import sys
import tempfile
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GLOBS = ["README.md", "docs/**/*.md", "charts/**/README.md", "overrides/**/*.md", "examples/**/*.md"]

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']|\sid\s*=\s*["']([^"']+)["']""", re.I)
# [text](target "title"): text may hold one level of brackets, target one level of parentheses.
INLINE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*(<[^>]*>|(?:[^()\s]|\([^()\s]*\))*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
REF_USE = re.compile(r"(?<![\]\\])\[((?:[^\[\]]|\[[^\]]*\])+)\]\[([^\]]*)\](?!\s*[(:])")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield n, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):].strip():
            fence = None


def slugify(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    out = []
    for ch in text:
        if ch in "-_ " or unicodedata.category(ch)[0] in "LNM":
            out.append("-" if ch == " " else ch)
    return "".join(out)


def anchors(path, cache={}):
    """Every anchor a markdown file defines."""
    if path not in cache:
        text = path.read_text(encoding="utf-8", errors="replace")
        found, seen = set(), {}
        prev = None
        for _, line in prose_lines(text):
            title = None
            m = ATX.match(line)
            if m:
                title = m.group(2) or ""
            elif prev is not None and prev.strip() and SETEXT.match(line) and not ATX.match(prev):
                title = prev.strip()
            if title is not None:
                slug = slugify(title)
                if slug in seen:
                    seen[slug] += 1
                    found.add(f"{slug}-{seen[slug]}")
                else:
                    seen[slug] = 0
                    found.add(slug)
            for a, b in HTML_ANCHOR.findall(line):
                found.add(a or b)
            prev = line
        cache[path] = found
    return cache[path]


def is_relative(target):
    target = target[1:-1] if target.startswith("<") and target.endswith(">") else target
    return bool(target) and not SCHEME.match(target) and not target.startswith("//")


def check_target(src, target, root):
    """None when the relative `target` (as written in `src`) resolves, else why not."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    path_part, _, frag = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if not path_part:
        dest = src
    elif path_part.startswith("/"):
        dest = root / path_part.lstrip("/")
    else:
        dest = src.parent / path_part
    dest = Path(os.path.normpath(dest))
    if not dest.exists():
        return "no such file"
    if frag and dest.is_file() and dest.suffix.lower() in (".md", ".markdown"):
        if unquote(frag).lower() not in anchors(dest):
            return f"no heading '#{frag}' in {os.path.relpath(dest, root)}"
    return None


def check_file(path, root):
    """(links checked, [(line, target, why)])"""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = list(prose_lines(text))
    defs = {}
    for n, line in lines:
        m = REF_DEF.match(line)
        if m:
            defs[m.group(1).strip().lower()] = (n, m.group(2))
    count, broken = 0, []
    for n, line in lines:
        if REF_DEF.match(line):
            continue
        prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE.finditer(prose):
            if not is_relative(m.group(2)):
                continue
            count += 1
            why = check_target(path, m.group(2), root)
            if why:
                broken.append((n, m.group(2), why))
        for m in REF_USE.finditer(INLINE.sub(" ", prose)):
            label = (m.group(2) or m.group(1)).strip().lower()
            if label not in defs:
                count += 1
                broken.append((n, f"[{m.group(1)}][{m.group(2)}]", "undefined reference"))
    for label, (n, target) in sorted(defs.items(), key=lambda kv: kv[1][0]):
        if not is_relative(target):
            continue
        count += 1
        why = check_target(path, target, root)
        if why:
            broken.append((n, target, why))
    return count, sorted(broken)


def run(files, root, out=sys.stdout):
    total, problems = 0, []
    for f in files:
        count, broken = check_file(f, root)
        total += count
        rel = os.path.relpath(f, root)
        problems += [f"{rel}:{n}: {target} ({why})" for n, target, why in broken]
    for p in problems:
        print(p, file=out)
    if problems:
        print(f"check-links: {len(problems)} broken of {total} relative links in {len(files)} files", file=out)
        return 1
    print(f"check-links: ok, {total} links in {len(files)} files", file=out)
    return 0


def default_files(root):
    files = set()
    for pattern in DEFAULT_GLOBS:
        files.update(p for p in root.glob(pattern) if p.is_file() and not any(
            part in (".git", "node_modules", "target", ".peers") for part in p.relative_to(root).parts))
    return sorted(files)


def self_test():
    import io
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "docs" / "a.md").write_text(
            "# Title\n\n## Same (twice)\n\n## Same (twice)\n\n## `code` and [link](b.md)\n\n"
            "Setext heading\n--------------\n\n<a name=\"custom\"></a>\n[back](../README.md#intro)\n")
        (root / "docs" / "b.md").write_text("# B\n")
        (root / "README.md").write_text(
            "# Intro\n\n"
            "[good](docs/a.md) [dup](docs/a.md#same-twice-1) [code](docs/a.md#code-and-link) [setext](docs/a.md#setext-heading)\n"
            "[custom](docs/a.md#custom) [self](#intro) ![img](docs) [ref][r] [web](https://example.com/x.md)\n"
            "`[in a code span](missing.md)`\n\n"
            "```md\n[in a fence](missing.md)\n# not a heading\n```\n\n"
            "[broken file](docs/missing.md)\n"
            "[broken anchor](docs/a.md#same-twice-2)\n"
            "[no heading](#not-a-heading)\n"
            "[dangling][nowhere]\n\n"
            "[r]: docs/a.md#title\n")
        out = io.StringIO()
        rc = run(default_files(root), root, out)
        got = [l for l in out.getvalue().splitlines() if not l.startswith("check-links:")]
        want = [
            "README.md:12: docs/missing.md (no such file)",
            "README.md:13: docs/a.md#same-twice-2 (no heading '#same-twice-2' in docs/a.md)",
            "README.md:14: #not-a-heading (no heading '#not-a-heading' in README.md)",
            "README.md:15: [dangling][nowhere] (undefined reference)",
        ]
        assert rc == 1 and got == want, f"self-test failed:\n  got  {got}\n  want {want}"
        assert "4 broken of 14 relative links in 3 files" in out.getvalue(), out.getvalue()
        for name in ("README.md",):
            text = (root / name).read_text().split("\n[broken file]")[0] + "\n\n[r]: docs/a.md#title\n"
            (root / name).write_text(text)
        out = io.StringIO()
        assert run(default_files(root), root, out) == 0, out.getvalue()
    print("check-links: self-test ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if any(a.startswith("-") for a in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    files = [Path(a).resolve() for a in argv[1:]] or default_files(ROOT)
    return run(files, ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
