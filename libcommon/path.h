/* path.h — joining paths the way users type them.
 *
 * A directory given as "run/" and a name joined with "/" would print "run//step-…": every
 * place that joins a user's directory with a name writes the directory through
 * path_dir_len(), as in snprintf(p, n, "%.*s/%s", path_dir_len(dir), dir, name). */
#ifndef FTK_PATH_H
#define FTK_PATH_H

#include <string.h>

/* The length of dir without its trailing slashes ("/" itself keeps its one; "" gives 0). */
static inline int path_dir_len(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return (int)n;
}

/* Whether path is dir or lies under it, both resolved (realpath: no link, no ..): the
 * length of dir's part of path, so that path + it is "" or "/rest"; -1 when it is not
 * under dir ("/runx" is not under "/run"; everything is under "/"). */
static inline int path_under(const char *path, const char *dir)
{
    size_t n = strcmp(dir, "/") ? strlen(dir) : 0;
    return !strncmp(path, dir, n) && (!path[n] || path[n] == '/') ? (int)n : -1;
}

#endif
