/* atomic.h — outputs that appear under their final name only when complete.
 *
 * atomic_begin() picks a hidden temporary name in the final file's directory
 * (".NAME.tmp.PID"); the caller writes there (with stdio, HDF5, anything), closes it, then
 * atomic_commit() fsyncs the file, renames it over the final name and fsyncs the directory,
 * so a crash at any instant leaves either the old file or the complete new one.
 * atomic_abort() removes the temporary. Temporaries still registered when SIGINT, SIGTERM
 * or SIGHUP arrives are unlinked by a handler before the process dies with that signal
 * (atomic_install_signal_cleanup(), called by tools that write files).
 *
 * Returns 0, or -1 with ftk_err_msg() set. The struct owns its two strings until commit or
 * abort.
 */
#ifndef FTK_ATOMIC_H
#define FTK_ATOMIC_H

typedef struct {
    char *final_path;
    char *tmp_path;
} atomic_file_t;

int atomic_begin(atomic_file_t *a, const char *final_path);
int atomic_commit(atomic_file_t *a);
void atomic_abort(atomic_file_t *a);
void atomic_install_signal_cleanup(void);

/* fsync a file or directory by path. Returns 0 or -1 with ftk_err_msg() set. */
int fsync_path(const char *path);

#endif
