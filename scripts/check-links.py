#!/usr/bin/env python3
"""check-links.py FILE.md...: every relative link in the given markdown files resolves: the
file exists, and a #anchor names a heading of the target (GitHub's slugs) or an <a id>.
Usage: python3 scripts/check-links.py README.md docs/*.md   (exit 1 when one is broken)"""
import os, re, sys

def slugs(path):
    out, seen = set(), {}
    text = open(path, encoding='utf-8').read()
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    for line in text.splitlines():
        m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        t = m.group(2).strip().lower()
        t = re.sub(r'[^\w\- ]', '', t)   # GitHub: drop punctuation, keep letters, digits, _ -
        t = t.replace(' ', '-')
        n = seen.get(t, 0)
        seen[t] = n + 1
        out.add(t if n == 0 else f'{t}-{n}')
    for m in re.finditer(r'<a (?:id|name)="([^"]+)"', text):
        out.add(m.group(1))
    return out

bad = 0
n = 0
for md in sys.argv[1:]:
    text = open(md, encoding='utf-8').read()
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    text = re.sub(r'`[^`\n]*`', '', text)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text):
        target = m.group(1)
        if re.match(r'^[a-z]+:', target):
            continue
        n += 1
        path, _, anchor = target.partition('#')
        full = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
        if not os.path.exists(full):
            print(f'{md}: {target}: no such file'); bad += 1; continue
        if anchor and full.endswith('.md') and anchor not in slugs(full):
            print(f'{md}: {target}: no heading #{anchor} in {full}'); bad += 1
print(f'{n} relative links checked, {bad} broken')
sys.exit(1 if bad else 0)
