#!/usr/bin/env python3
"""The house's rules, checked: no tool over 600 lines, no function over 120, the strategies
decided by their traits (at most a handful of lines name one outside engine/strategy.c), no
circle of calls.

Usage: house.py ROOT [--list] [--objects DIR]

Reads the product's C and CUDA sources (libcommon/ formats/ kernels/ engine/ tools/) as text:
comments, strings and character literals are blanked, then every brace at depth 0 that follows a
closing parenthesis opens a function body; its length counts from the line of the function's name
to its closing brace. Prints every offender as FILE:LINE: NAME N lines and exits 1 if any;
--list prints the ten longest functions and the tools' line counts as well.

--objects DIR (the build's object folder, e.g. build): the library's objects under DIR
(libcommon/ formats/ kernels/ engine/) are read with nm, and a file that calls (or reads) a
symbol another file defines depends on it; a circle of such files is an offender (the floors
rule one way between folders, this one within a folder too).
"""
import collections
import glob
import os
import re
import subprocess
import sys

MAX_TOOL_LINES = 600
MAX_STRATEGY_LINES = 4  # lines naming a STRAT_ constant outside engine/strategy.[ch]: the traits decide
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


def circles(objdir):
    """Lists of objects (relative to objdir) that depend on each other in a circle."""
    objs = []
    for folder in FOLDERS:
        if folder != "tools":
            objs += sorted(glob.glob(os.path.join(objdir, folder, "**", "*.o"), recursive=True))
    defined, used = {}, {}
    for o in objs:
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        used[o] = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRCVW":
                defined.setdefault(f[2], set()).add(o)
            elif len(f) == 2 and f[0] == "U":
                used[o].add(f[1])
    edges = {o: {d for s in used[o] for d in defined.get(s, ()) if d != o} for o in objs}
    # Tarjan's strongly connected components, iteratively
    index, low, stack, on, found = {}, {}, [], set(), []
    for root in objs:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    ties = []
                    for a in sorted(comp):
                        for b in sorted(comp):
                            if b in edges[a]:
                                names = sorted(x for x in used[a] if b in defined.get(x, ()))
                                ties.append("%s -> %s (%s)" % (os.path.relpath(a, objdir),
                                                              os.path.relpath(b, objdir), ", ".join(names[:4])))
                    found.append(ties)
    return found, len(objs)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    listing = "--list" in sys.argv
    objdir = sys.argv[sys.argv.index("--objects") + 1] if "--objects" in sys.argv else None
    bad = []
    every = []
    tools = []
    strat_lines = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                if not rel.startswith("engine/strategy."):
                    code = blank(open(path, encoding="utf-8", errors="replace").read()).split("\n")
                    strat_lines += ["%s:%d" % (rel, i + 1) for i, l in enumerate(code) if re.search(r"\bSTRAT_[A-Z]", l)]
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
    if len(strat_lines) > MAX_STRATEGY_LINES:
        bad.append("%d lines name a strategy outside engine/strategy.c (at most %d; give the strategy a trait): %s"
                   % (len(strat_lines), MAX_STRATEGY_LINES, ", ".join(strat_lines)))
    n_objs = 0
    if objdir:
        found, n_objs = circles(objdir)
        if not n_objs:
            bad.append("%s: no object files (build first)" % objdir)
        for ties in found:
            bad.append("a circle of calls between files: " + "; ".join(ties))
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
    print("house: %d functions, %d tools%s: %s" % (len(every), len(tools),
                                                ", %d objects" % n_objs if objdir else "",
                                                "%d offenders" % len(bad) if bad else "within the rules"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
