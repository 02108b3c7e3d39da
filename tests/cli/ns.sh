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

# hide_paths SPARE PATH...: inside the namespace, every existing PATH is mounted over by an
# empty file (a non-empty regular file) or an empty folder (a folder), both kept in the
# folder SPARE (SPARE/file, SPARE/folder: names no build rule takes for its own); $hidden
# counts them.
hide_paths() {
    hp_spare=$1
    shift
    mkdir -p "$hp_spare/folder" && : >"$hp_spare/file" || return 1
    for hp in "$@"; do
        if [ -d "$hp" ]; then
            mount --bind "$hp_spare/folder" "$hp" 2>/dev/null && hidden=$((${hidden:-0} + 1))
        elif [ -f "$hp" ] && [ -s "$hp" ]; then
            mount --bind "$hp_spare/file" "$hp" 2>/dev/null && hidden=$((${hidden:-0} + 1))
        fi
    done
}
