/* atomic.h — outputs that appear under their final name only when complete.
 *
 * atomic_begin() picks a hidden temporary name in the final file's directory
 * (".NAME.tmp.PID"); the caller writes there (with stdio, HDF5, anything), closes it, then
 * atomic_commit() fsyncs the file, renames it over the final name and fsyncs the directory,
 * so a crash at any instant leaves either the old file or the complete new one.
 * atomic_abort() removes the temporary. Temporaries still registered when SIGINT, SIGTERM
 * or SIGHUP arrives are unlinked by a handler before the process dies with that signal
 * (atomic_install_signal_cleanup(), called by tools that write files): every one, however
 * many there are (ftk-pack --shards 99999 holds that many at once; the handler walks a
 * list made outside it, async-signal-safe).
 *
 * Returns 0, or -1 with ftk_err_msg() set. The struct owns its two strings until commit or
 * abort.
 */
#ifndef FTK_ATOMIC_H
#define FTK_ATOMIC_H

#include <stddef.h>

typedef struct {
    char *final_path;
    char *tmp_path;
    void *pending_; /* private: the signal handler's record of tmp_path */
} atomic_file_t;

int atomic_begin(atomic_file_t *a, const char *final_path);
int atomic_commit(atomic_file_t *a);
/* atomic_commit() that never replaces: a file that appeared at the final name meanwhile
 * fails it ("exists (use --force to replace it)"; EEXIST) and the temporary is removed.
 * link(2) then unlink(2) of the temporary; where the file system has no hard links, a
 * check then the rename. */
int atomic_commit_new(atomic_file_t *a);
void atomic_abort(atomic_file_t *a);
void atomic_install_signal_cleanup(void);
/* The whole file from memory, through the steps above (len 0: an empty file). */
int atomic_write_file(const char *final_path, const void *data, size_t len);

/* The same for a directory of files (an HF model folder): atomic_dir_begin() makes the
 * hidden directory ".NAME.tmp.PID" beside the final one; atomic_dir_file() names a file
 * inside it (malloc'd, owned by the struct; the signal handler empties the directory);
 * atomic_dir_commit() fsyncs every file and the directory, then renames it into place.
 * An existing final directory is an error unless replace is set, in which case it is
 * removed only after the new one is in place. */
typedef struct {
    char *final_path;
    char *tmp_path;
    char **files;
    size_t n_files;
} atomic_dir_t;

int atomic_dir_begin(atomic_dir_t *a, const char *final_path);
char *atomic_dir_file(atomic_dir_t *a, const char *name);
int atomic_dir_commit(atomic_dir_t *a, int replace);
void atomic_dir_abort(atomic_dir_t *a);
/* A directory this process made to hold a temporary (ftk-reshard's new run directory):
 * the signal handler removes it too when it is empty by then (after the temporaries in
 * it). path must stay valid until atomic_unregister_dir(). A temporary directory of
 * atomic_dir_begin() is emptied by the handler (its plain files, registered or not:
 * checkpoint shards written by ckpt_shard_create()) and removed. */
void atomic_register_dir(char *path);
void atomic_unregister_dir(const char *path);
/* A file this process made that the signal handler unlinks (before the directories):
 * the lock file of a run directory made as above. path must stay valid until
 * atomic_unregister_file(). */
void atomic_register_file(char *path);
void atomic_unregister_file(const char *path);
/* mkdir -p of path's parent (the directories above path that are missing, mode 0777),
 * for an output directory given nested (LitGPT's out/finetune/full-llama2-7b); *made: how
 * many it made. Returns 0, or -1 with ftk_err_msg() naming the directory that could not be
 * made (and those it made removed). rmdir_parents() removes the n nearest directories
 * above path, those mkdir_parents() made, as far as they are empty. */
int mkdir_parents(const char *path, int *made);
void rmdir_parents(const char *path, int n);
/* rm -r path (no error when it does not exist). */
int rm_tree(const char *path);

/* fsync a file or directory by path. Returns 0 or -1 with ftk_err_msg() set. */
int fsync_path(const char *path);

#endif
