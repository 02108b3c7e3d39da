#!/usr/bin/env python3
"""The house's size rules, checked: no tool over 600 lines, no function over 120.

Usage: house.py ROOT [--list]

Reads the product's C and CUDA sources (libcommon/ formats/ kernels/ engine/ tools/) as text:
comments, strings and character literals are blanked, then every brace at depth 0 that follows a
closing parenthesis opens a function body; its length counts from the line of the function's name
to its closing brace. Prints every offender as FILE:LINE: NAME N lines and exits 1 if any;
--list prints the ten longest functions and the tools' line counts as well.
"""
import os
import re
import sys

MAX_TOOL_LINES = 600
MAX_FUNCTION_LINES = 120
FOLDERS = ("libcommon", "formats", "kernels", "engine", "tools")
SUFFIXES = (".c", ".h", ".cu", ".cuh")


def blank(text):
    """Comments, strings and char literals replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            # a preprocessor line (with its continuations) holds no function body
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of every function body in the file."""
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    found = []
    depth = 0
    start = None
    open_scopes = []  # depths at which an extern "C" or namespace block opened: transparent
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            if depth == 0 and re.search(r'(extern\s*" *"|namespace(\s+\w+)?)\s*$', text[:m.start()]):
                open_scopes.append(depth)
                continue
            if depth == 0:
                head = text[:m.start()].rstrip()
                if head.endswith(")") or re.search(r"\)\s*(const|noexcept|__attribute__\s*\(\(.*\)\))\s*$", head):
                    # the name is the identifier before the parameter list's opening parenthesis
                    k, level = len(head) - 1, 0
                    while k >= 0:
                        if head[k] == ")":
                            level += 1
                        elif head[k] == "(":
                            level -= 1
                            if level == 0:
                                break
                        k -= 1
                    nm = re.search(r"([A-Za-z_][A-Za-z0-9_:]*)\s*$", head[:k])
                    if nm and nm.group(1) not in ("if", "for", "while", "switch", "sizeof"):
                        start = (nm.group(1), head.count("\n", 0, nm.start()) + 1)
            depth += 1
        else:
            if depth == 0 and open_scopes:
                open_scopes.pop()
                continue
            depth -= 1
            if depth == 0 and start:
                end = text.count("\n", 0, m.start()) + 1
                found.append((start[0], start[1], end - start[1] + 1))
                start = None
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    listing = "--list" in sys.argv
    bad = []
    every = []
    tools = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                for name, line, n in functions(path):
                    every.append((n, rel, line, name))
                    if n > MAX_FUNCTION_LINES:
                        bad.append("%s:%d: function %s is %d lines (at most %d)"
                                   % (rel, line, name, n, MAX_FUNCTION_LINES))
                if folder == "tools" and f.endswith(".c"):
                    lines = open(path, encoding="utf-8", errors="replace").read().count("\n")
                    tools.append((lines, rel))
                    if lines > MAX_TOOL_LINES:
                        bad.append("%s: the tool is %d lines (at most %d: its work belongs in "
                                   "the library folders)" % (rel, lines, MAX_TOOL_LINES))
    if listing:
        for n, rel, line, name in sorted(every, reverse=True)[:10]:
            print("%5d  %s:%d %s" % (n, rel, line, name))
        for lines, rel in sorted(tools, reverse=True):
            print("%5d  %s" % (lines, rel))
    for b in bad:
        print(b)
    if not every:
        print("house: no function found under %s" % root)
        return 1
    print("house: %d functions, %d tools: %s" % (len(every), len(tools),
                                              "%d offenders" % len(bad) if bad else "within the rules"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
