#!/bin/sh
# LitGPT itself against `ftk-train --recipe litgpt` (tests/slow/litgpt_ref.py; make test-slow).
# LitGPT is test-only: the pinned version, with the torch 2.x and lightning it requires (a
# download of gigabytes; Debian's torch 1.13 is too old for it), from PyPI into a virtual
# environment under build/, kept between runs. Where it cannot be installed (no network,
# no venv module) the test is skipped, saying why.
# Usage: litgpt_ref.sh BIN ROOT WORK
set -u
BIN=$1 ROOT=$2 WORK=$3
VENV=$ROOT/build/litgpt-venv
# the venv has its own packages: build/pylib's (tests/run.sh puts it on PYTHONPATH for the
# reference tests) are pinned for Debian's torch 1.13 and would shadow them
unset PYTHONPATH
PINS="litgpt==0.5.13 sentencepiece==0.2.0 h5py==3.12.1"
mkdir -p "$WORK"
. "$ROOT/tests/extras.sh"
if ! extras_kept "$VENV" $PINS || ! "$VENV/bin/python" -c 'import litgpt, sentencepiece, h5py' 2>/dev/null; then
    rm -rf "$VENV"
    echo "installing $PINS into $VENV (once; gigabytes)"
    if ! /usr/bin/python3 -m venv "$VENV" >"$WORK/venv.log" 2>&1 ||
        ! "$VENV/bin/pip" install -q --disable-pip-version-check $PINS >>"$WORK/venv.log" 2>&1 ||
        ! "$VENV/bin/python" -c 'import litgpt, sentencepiece, h5py' >>"$WORK/venv.log" 2>&1; then
        echo "skipped (LitGPT could not be installed into $VENV: $(tail -n 1 "$WORK/venv.log"))"
        exit 77
    fi
    extras_done "$VENV" $PINS
fi
exec "$VENV/bin/python" "$ROOT/tests/slow/litgpt_ref.py" "$BIN" "$ROOT" "$WORK"
