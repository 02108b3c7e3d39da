/* strategy.c — strategy names (strategy.h). */
#include "strategy.h"

#include <string.h>

static const char *const names[] = {"full", "grad-op", "none", "hybrid", "hpz"};

int strategy_parse(const char *name, strategy_t *s)
{
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(name, names[i])) {
            *s = (strategy_t)i;
            return 0;
        }
    return -1;
}

const char *strategy_name(strategy_t s) { return names[s]; }
