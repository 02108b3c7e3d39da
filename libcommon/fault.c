/* fault.c — named fault points (fault.h): FTK_FAULT parsed once, counters per spec. */
#include "fault.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { ACT_KILL, ACT_STOP, ACT_EXIT, ACT_SIG, ACT_PSIG, ACT_ENOSPC, ACT_EIO, ACT_SLEEP };

typedef struct {
    char site[64];
    int rank;       /* -1: any */
    long n;         /* fire at the n-th hit ... */
    int and_later;  /* ... and every later one */
    int action, arg; /* signal number or milliseconds */
    char text[32];  /* the action as written, for the log */
    atomic_long hits;
} spec_t;

#define MAX_SPECS 16
#define FAULT_STR_(x) #x
#define FAULT_STR(x) FAULT_STR_(x)
static spec_t specs[MAX_SPECS];
static int n_specs;
static int my_rank;
static atomic_int state; /* 0 unparsed, 1 parsing, 2 none, 3 armed */

static int signal_number(const char *s)
{
    static const struct { const char *name; int sig; } t[] = {
        {"TERM", SIGTERM}, {"INT", SIGINT}, {"HUP", SIGHUP}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
        {"KILL", SIGKILL}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}, {"QUIT", SIGQUIT}, {"ABRT", SIGABRT}};
    if (!strncmp(s, "SIG", 3))
        s += 3;
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(s, t[i].name))
            return t[i].sig;
    return 0;
}

/* A count, a rank or milliseconds: decimal digits only, at most max (not strtol, which
 * takes a sign and blanks, and reads "" as 0: "@" would aim at rank 0). Returns 0 or -1. */
static int parse_count(const char *s, const char **end, long max, long *out)
{
    long v = 0;
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++) {
        if (v > (max - (*c - '0')) / 10)
            return -1;
        v = v * 10 + (*c - '0');
    }
    if (c == s)
        return -1;
    *end = c;
    *out = v;
    return 0;
}

/* One SPEC; a malformed one is reported on stderr, as it was written, and ignored (a test
 * that relies on it then fails its landing check, which names FTK_FAULT_LOG). */
static void parse_spec(const char *spec)
{
    char s[256];
    const char *why = NULL, *end;
    long v;
    if (!*spec)
        return;
    if (n_specs == MAX_SPECS) {
        why = "more SPECs than " FAULT_STR(MAX_SPECS);
        goto bad;
    }
    if (strlen(spec) >= sizeof s) {
        why = "too long";
        goto bad;
    }
    snprintf(s, sizeof s, "%s", spec);
    spec_t *p = &specs[n_specs];
    memset(p, 0, sizeof *p);
    p->rank = -1;
    p->n = 1;
    p->action = ACT_KILL;
    snprintf(p->text, sizeof p->text, "kill");
    char *parts[3] = {s, NULL, NULL};
    int k = 1;
    for (char *c = s; *c; c++)
        if (*c == ':') {
            if (k == 3) {
                why = "more than SITE, N and ACTION";
                goto bad;
            }
            *c = 0;
            parts[k++] = c + 1;
        }
    char *at = strchr(parts[0], '@');
    if (at) {
        *at = 0;
        /* a world rank is an int */
        if (parse_count(at + 1, &end, INT_MAX, &v) < 0 || *end) {
            why = "RANK is not a world rank, 0 to 2147483647";
            goto bad;
        }
        p->rank = (int)v;
    }
    if (!parts[0][0] || strlen(parts[0]) >= sizeof p->site) {
        why = parts[0][0] ? "SITE too long" : "no SITE";
        goto bad;
    }
    snprintf(p->site, sizeof p->site, "%s", parts[0]);
    int got_n = 0, got_action = 0;
    for (int i = 1; i < k; i++) {
        char *a = parts[i];
        if (a[0] >= '0' && a[0] <= '9') {
            if (got_n++) {
                why = "two Ns";
                goto bad;
            }
            if (parse_count(a, &end, LONG_MAX, &v) < 0 || v < 1 || (*end && strcmp(end, "+"))) {
                why = "N is not a count from 1, N or N+";
                goto bad;
            }
            p->n = v;
            p->and_later = *end == '+';
            continue;
        }
        if (got_action++) {
            why = "two ACTIONs";
            goto bad;
        }
        snprintf(p->text, sizeof p->text, "%s", a);
        if (!strcmp(a, "kill"))
            p->action = ACT_KILL;
        else if (!strcmp(a, "stop"))
            p->action = ACT_STOP;
        else if (!strcmp(a, "exit"))
            p->action = ACT_EXIT;
        else if (!strcmp(a, "enospc"))
            p->action = ACT_ENOSPC;
        else if (!strcmp(a, "eio"))
            p->action = ACT_EIO;
        else if (!strncmp(a, "sig=", 4) && (p->arg = signal_number(a + 4)))
            p->action = ACT_SIG;
        else if (!strncmp(a, "psig=", 5) && (p->arg = signal_number(a + 5)))
            p->action = ACT_PSIG;
        else if (!strncmp(a, "sleep=", 6)) {
            if (parse_count(a + 6, &end, 3600000, &v) < 0 || *end) {
                why = "sleep=MS takes 0 to 3600000 milliseconds";
                goto bad;
            }
            p->action = ACT_SLEEP;
            p->arg = (int)v;
        } else {
            why = "no such ACTION: kill, stop, exit, sig=NAME, psig=NAME (NAME: TERM, INT, HUP, USR1, USR2, ...), "
                  "enospc, eio, sleep=MS";
            goto bad;
        }
    }
    n_specs++;
    return;
bad:
    fprintf(stderr, "ftk: FTK_FAULT: cannot read '%s': %s (SITE[@RANK][:N[+]][:ACTION]); ignored\n", spec, why);
}

static void parse(void)
{
    const char *env = getenv("FTK_FAULT");
    if (!env || !*env)
        return;
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            my_rank = atoi(v);
            break;
        }
    }
    char *copy = strdup(env);
    if (!copy)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        parse_spec(tok);
    free(copy);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init(void)
{
    parse();
    atomic_store(&state, n_specs ? 3 : 2);
}

static int armed(void)
{
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == 0) {
        pthread_once(&once, init);
        s = atomic_load(&state);
    }
    return s == 3;
}

int fault_armed(const char *site)
{
    if (!armed())
        return 0;
    for (int i = 0; i < n_specs; i++)
        if (!strcmp(specs[i].site, site) && (specs[i].rank < 0 || specs[i].rank == my_rank))
            return 1;
    return 0;
}

/* The landing record: before the action, so that a process that kills itself leaves it. */
static void record(const spec_t *p, long hit)
{
    char line[256];
    int len = snprintf(line, sizeof line, "%s %ld %s pid=%ld rank=%d\n", p->site, hit, p->text, (long)getpid(),
                       my_rank);
    if (len < 0 || len >= (int)sizeof line)
        len = (int)sizeof line - 1;
    const char *path = getenv("FTK_FAULT_LOG");
    if (path && *path) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, line, (size_t)len);
            (void)w;
            close(fd);
        }
    }
    fprintf(stderr, "ftk: fault: %s #%ld: %s\n", p->site, hit, p->text);
    fflush(stderr);
}

int fault_point(const char *site)
{
    if (!armed())
        return 0;
    int rc = 0;
    for (int i = 0; i < n_specs; i++) {
        spec_t *p = &specs[i];
        if (strcmp(p->site, site) || (p->rank >= 0 && p->rank != my_rank))
            continue;
        long hit = atomic_fetch_add(&p->hits, 1) + 1;
        if (hit != p->n && !(p->and_later && hit > p->n))
            continue;
        record(p, hit);
        switch (p->action) {
        case ACT_KILL:
            kill(getpid(), SIGKILL);
            _exit(137);
        case ACT_STOP:
            kill(getpid(), SIGSTOP);
            break;
        case ACT_EXIT:
            _exit(1);
        case ACT_SIG:
            kill(getpid(), p->arg);
            break;
        case ACT_PSIG:
            kill(getppid(), p->arg);
            break;
        case ACT_ENOSPC:
        case ACT_EIO:
            ftk_err_set("%s (FTK_FAULT at %s)", strerror(p->action == ACT_ENOSPC ? ENOSPC : EIO), site);
            errno = p->action == ACT_ENOSPC ? ENOSPC : EIO;
            rc = -1;
            break;
        case ACT_SLEEP: {
            struct timespec ts = {p->arg / 1000, (long)(p->arg % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
            break;
        }
        }
    }
    return rc;
}
