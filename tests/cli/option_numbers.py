#!/usr/bin/env python3
"""Every numeric option of every tool, fed the numbers an adversary tries.

For each tool in BIN, `TOOL --list-options` gives its options with their kinds and ranges
(libcommon/opts.h); every int, i64 and double option is added, with each value of VALUES,
to the tool's command lines in tests/cli/option_numbers.table (which make it fail fast after its
checks). Each run must not crash (no exit >= 128, no sanitizer report: run by tests/run.sh
with the sanitizer build too, where a finding exits 86), and:
  - a value outside the option's range (or not a number of its kind): exit 2 and a
    message naming the option;
  - a value inside it: not refused as a bad value of that option.
Then the runs that must leave nothing: ftk-train refused before its first step (huge -j, an
overflowing product) leaves no run directory.

Usage: option_numbers.py BIN_DIR WORK_DIR [JOBS]
"""
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
JOBS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
TOK = os.path.join(ROOT, "examples/demo/tokenizer.model")
JSON = os.path.join(ROOT, "examples/demo/alpaca-demo.json")

# 0, -1, NaN, infinity, 2^31 (past int), 2^63 - 1, 2^63 (past int64), 100000 (a -j that
# crashed libgomp)
VALUES = ["0", "-1", "nan", "inf", "2147483648", "9223372036854775807", "9223372036854775808", "100000"]

checks = failed = 0


def ok(name):
    global checks
    checks += 1
    print("ok   " + name)


def notok(name, err=""):
    global checks, failed
    checks += 1
    failed += 1
    print("FAIL " + name)
    for line in err.splitlines()[:8]:
        print("     | " + line)


# Several runs at once: OpenMP threads that sleep when idle, not spin (the runs share the cores)
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")


def run(args, timeout=300):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, cwd=WORK, env=ENV)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def parse_range(r):
    """(lo, lo_open, hi, hi_open) as Fractions or None (opts.h's syntax)."""
    m = re.fullmatch(r"([^.<]*)(<?)\.\.(<?)([^.<]*)", r)
    if not m:
        raise ValueError("not a range: %r" % r)
    lo = Fraction(m.group(1)) if m.group(1) else None
    hi = Fraction(m.group(4)) if m.group(4) else None
    return lo, m.group(2) == "<", hi, m.group(3) == "<"


def in_range(kind, rng, value):
    """Whether opts_parse must accept value for an option of this kind and range."""
    lo, lo_open, hi, hi_open = parse_range(rng)
    if kind in ("int", "i64"):
        if not re.fullmatch(r"[+-]?[0-9]+", value):
            return False
        v = int(value)
        bits = 31 if kind == "int" else 63
        if not -(2 ** bits) <= v < 2 ** bits:
            return False
        v = Fraction(v)
    else:
        try:
            f = float(value)
        except ValueError:
            return False
        if f != f or f in (float("inf"), float("-inf")):
            return False
        v = Fraction(f)
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    if hi is not None and (v >= hi if hi_open else v > hi):
        return False
    return True


SANITIZER = re.compile(r"runtime error|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer")


def crashed(rc, err):
    return rc >= 128 or rc < 0 or rc == 86 or SANITIZER.search(err) is not None


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    open(os.path.join(WORK, "file"), "w").close()
    M, D = os.path.join(WORK, "w.h5"), os.path.join(WORK, "d.h5")
    for args in ([BIN + "/ftk-init", "-q", "--preset", "tiny", "--seed", "1", "-t", TOK, "-o", M],
                 [BIN + "/ftk-pack", "-q", "-t", TOK, JSON, "-o", D, "--pack", "--max-len", "64", "--val-count", "4"]):
        rc, _, err = run(args)
        if rc:
            print("cannot make the inputs: %s: exit %d\n%s" % (" ".join(args), rc, err))
            return 1
    subst = {"M": M, "D": D, "TOK": TOK, "JSON": JSON, "W": WORK}

    table = {}
    with open(os.path.join(ROOT, "tests/cli/option_numbers.table")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                words = [re.sub(r"\{(\w+)\}", lambda m: subst[m.group(1)], w) for w in line.split()]
                table.setdefault(words[0], []).append(words[1:])

    # every tool, every numeric option
    cases = []
    tools = sorted(t for t in os.listdir(BIN) if t.startswith("ftk-") and os.access(os.path.join(BIN, t), os.X_OK))
    for tool in tools:
        rc, out, err = run([os.path.join(BIN, tool), "--list-options"])
        if rc != 0 or crashed(rc, err):
            notok("%s --list-options: exit %d" % (tool, rc), err)
            continue
        numeric = []
        for line in out.splitlines():
            name, short, kind, rng = (line.split("\t") + [""] * 4)[:4]
            if kind in ("int", "i64", "double"):
                try:
                    parse_range(rng)
                except ValueError:
                    notok("%s --%s: a range that parses (%r)" % (tool, name, rng))
                    continue
                numeric.append((name, kind, rng))
        if not numeric:
            continue
        if tool not in table:
            notok("%s has numeric options (%s) but no command line in tests/cli/option_numbers.table" %
                  (tool, ", ".join("--" + n for n, _, _ in numeric)))
            continue
        # a value outside the range is refused by the parser, whatever the command line: the
        # first line of the tool is enough for it
        for i, base in enumerate(table[tool]):
            for name, kind, rng in numeric:
                for v in VALUES:
                    if i == 0 or in_range(kind, rng, v):
                        cases.append((tool, base, name, kind, rng, v))

    times = []
    def one(c):
        tool, base, name, kind, rng, v = c
        args = [os.path.join(BIN, tool)] + base + ["--%s=%s" % (name, v)]
        t0 = time.time()
        rc, _, err = run(args)
        times.append((time.time() - t0, " ".join(args[:3]) + " " + args[-1], rc))
        return c, rc, err

    n_out = n_in = 0
    failed_before = failed
    with ThreadPoolExecutor(JOBS) as pool:
        for (tool, base, name, kind, rng, v), rc, err in pool.map(one, cases):
            what = "%s %s --%s=%s" % (tool, " ".join(base[:2]), name, v)
            if crashed(rc, err):
                notok("%s: no crash (exit %d)" % (what, rc), err)
                continue
            if in_range(kind, rng, v):
                n_in += 1
                if "option --%s:" % name in err:
                    notok("%s: inside the range %s, accepted" % (what, rng), err)
            else:
                n_out += 1
                if rc != 2 or "--" + name not in err:
                    notok("%s: outside the range %s: exit 2 naming the option (exit %d)" % (what, rng, rc), err)
    if failed == failed_before:
        ok("%d runs: %d values outside their option's range refused (exit 2, naming it), %d inside accepted, "
           "no crash" % (len(cases), n_out, n_in))

    for t in sorted(times)[-5:]:  # for the suite's time budget
        print("     slow: %.2f s %s (exit %d)" % t)
    # refused before the first step: no run directory left behind
    T = [BIN + "/ftk-train", "-q", "-m", M, "-d", D, "--eval-every", "0"]
    for extra, why in ((["-j", "2147483647"], "a huge -j"),
                       (["--micro-batch", "9223372036854775807"], "--micro-batch x max_len overflows"),
                       (["--global-batch", "1", "--epochs", "9223372036854775807"], "--epochs x steps overflows"),
                       (["--resume", os.path.join(WORK, "no-checkpoint")], "a --resume that does not exist")):
        run_dir = os.path.join(WORK, "run-new")
        rc, _, err = run(T + ["-o", run_dir] + extra)
        if rc == 2 and not crashed(rc, err) and not os.path.exists(run_dir):
            ok("ftk-train, %s: exit 2, no run directory left" % why)
        else:
            notok("ftk-train, %s: exit 2 (%d), no run directory left (%s)" %
                  (why, rc, os.listdir(run_dir) if os.path.isdir(run_dir) else "none"), err)
        shutil.rmtree(run_dir, ignore_errors=True)
    print("%d of %d checks passed" % (checks - failed, checks))
    return 1 if failed else 0


sys.exit(main())
