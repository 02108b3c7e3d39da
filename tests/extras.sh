# extras.sh — the tests' Python extras from PyPI (the product has no Python), kept between
# runs in folders under build/ (sourced by tests/run.sh, tests/cli/metrics.sh and
# tests/slow/litgpt_ref.sh). A folder holds what its pin list says, or it is not used: the
# list is written into it (.pins) only after the install succeeded, so a changed pin, or an
# install that was interrupted or failed half-way, is installed afresh rather than used as
# an earlier run left it.

# extras_kept DIR PIN...: whether DIR holds exactly PIN... (0); otherwise DIR, whatever an
# earlier run left there, is removed (1).
extras_kept() {
    ex_dir=$1
    shift
    [ "$(cat "$ex_dir/.pins" 2>/dev/null)" = "$*" ] && return 0
    rm -rf "$ex_dir"
    return 1
}

# extras_done DIR PIN...: records that the install of PIN... into DIR succeeded.
extras_done() {
    ex_dir=$1
    shift
    echo "$*" >"$ex_dir/.pins"
}
