#!/usr/bin/python3
"""Every relative link in README.md and docs/ (docs/*.md and its sub-folders) leads somewhere:
the file exists, and a #anchor names a heading of the target page (GitHub's anchors: the heading
text lower-cased, punctuation dropped, spaces as hyphens, -1, -2 ... for repeats). Links to
other sites (http:, https:, mailto:) are not followed.

  tests/docs/check_links.py [REPO_ROOT]     exit 0 when every link resolves, 1 with a list"""
import glob
import os
import re
import sys

FENCE = re.compile(r"^(```|~~~)")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code removed."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`+[^`]*`+", "", line)


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: letters, digits and _, any script
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        fenced = False
        for line in open(path, encoding="utf-8").read().splitlines():
            if FENCE.match(line.lstrip()):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                base = slug(m.group(2))
                k = seen.get(base, 0)
                out.add(base if k == 0 else "%s-%d" % (base, k))
                seen[base] = k + 1
        cache[path] = out
    return cache[path]


def check(root):
    docs = [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    bad, count = [], 0
    for doc in docs:
        for n, line in prose_lines(open(doc, encoding="utf-8").read()):
            targets = INLINE.findall(line)
            m = REFDEF.match(line)
            if m:
                targets.append(m.group(1))
            for target in targets:
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # another site, mailto:
                count += 1
                where = "%s:%d: %s" % (os.path.relpath(doc, root), n, target)
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
                if not os.path.exists(full):
                    bad.append(where + " (no such file)")
                elif anchor and full.endswith(".md") and anchor.lower() not in anchors(full):
                    bad.append(where + " (no heading with that anchor in %s)" %
                               os.path.relpath(full, root))
    return bad, count, len(docs)


if __name__ == "__main__":
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    bad, count, docs = check(root)
    for b in bad:
        print(b)
    print("%d relative links in %d pages, %d broken" % (count, docs, len(bad)))
    sys.exit(1 if bad else 0)
