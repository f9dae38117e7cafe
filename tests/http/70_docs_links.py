"""Every relative link of every Markdown file of the repository leads
somewhere: the file exists, and an anchor (#a-heading) names a heading of
the file it points into, as GitHub makes them (lower case, punctuation
dropped, spaces to hyphens, -1, -2 for repeats). Links to http(s) and
mailto are not followed."""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, Tap  # noqa: E402

t = Tap()

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [f for f in out.split() if os.path.isfile(os.path.join(ROOT, f))]


def prose(path):
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line.lstrip()):
                fenced = not fenced
                continue
            if not fenced:
                lines.append(line)
    return lines


def anchors(path):
    """The anchors GitHub gives the headings of a Markdown file."""
    seen, out = {}, set()
    for line in prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


checked, broken = 0, []
for md in markdown_files():
    for line in prose(md):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^(https?|mailto):", target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(os.path.join(ROOT, dest)):
                broken.append(f"{md}: {target} (no {dest})")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{md}: {target} (no heading #{anchor} in {dest})")

t.ok(checked > 0, f"relative links found in the Markdown files: {checked}")
t.ok(not broken, "every relative link leads to a file, and to a heading of it",
     "\n".join(broken))
t.done()
