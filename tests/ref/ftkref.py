"""Helpers shared by the reference tests: check() prints ok/FAIL and counts, run() runs
an ftk tool and stops the test when it fails, done() prints the summary and exits."""
import math, os, subprocess, sys

BIN = None
fails = 0

def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1

def run(*args):
    r = subprocess.run([os.path.join(BIN, args[0])] + list(args[1:]), capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit(f"{args[0]} failed with exit {r.returncode}")

def done():
    print(f"{'FAILED' if fails else 'all passed'} ({fails} failures)")
    sys.exit(1 if fails else 0)


def lr_at(step, lr, min_lr, warmup, total):
    """The schedule of `ftk-train --help`, written again: linear warmup, then cosine."""
    if step <= warmup:
        return lr * step / warmup
    p = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    return min_lr + 0.5 * (1 + math.cos(math.pi * p)) * (lr - min_lr)
