# ns.sh — a mount namespace in which tests hide system libraries (sourced by tests that
# prove what happens on a machine without them: tests/cli/nocuda.sh,
# tests/gpu/bundle/rehearsal.sh).

# need_unshare: sets NS to the command that enters a new mount namespace (unshare -m as
# root, else unshare -rm); exits 77, saying why, where there is none or it is refused.
need_unshare() {
    command -v unshare >/dev/null || { echo "skipped (unshare not found: util-linux)"; exit 77; }
    NS="unshare -m"
    [ "$(id -u)" = 0 ] || NS="unshare -rm"
    if ! ns_err=$($NS true 2>&1); then
        echo "skipped ($NS refused here: $ns_err)"
        exit 77
    fi
}

# hide_paths EMPTY_DIR PATH...: inside the namespace, every existing PATH is mounted over
# by an empty file (a non-empty regular file) or by EMPTY_DIR (a folder); $hidden counts them.
hide_paths() {
    hp_empty=$1
    shift
    [ -d "$hp_empty" ] || mkdir -p "$hp_empty" || return 1
    [ -f "$hp_empty.f" ] || : >"$hp_empty.f" || return 1
    for hp in "$@"; do
        if [ -d "$hp" ]; then
            mount --bind "$hp_empty" "$hp" 2>/dev/null && hidden=$((${hidden:-0} + 1))
        elif [ -f "$hp" ] && [ -s "$hp" ]; then
            mount --bind "$hp_empty.f" "$hp" 2>/dev/null && hidden=$((${hidden:-0} + 1))
        fi
    done
}
