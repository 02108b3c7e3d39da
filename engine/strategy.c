/* strategy.c — the strategies' traits and the rules on their options (strategy.h). */
#include "strategy.h"

#include <stdio.h>
#include <string.h>

#include "../libcommon/log.h"
#include "compress.h"

/* In strategy_t's order. */
static const strategy_traits_t table[] = {
    {.name = "full", .shards = 1, .releases = 1, .compress_weights = 1, .compress_grads = 1, .unit_policies = 1},
    {.name = "grad-op", .shards = 1, .compress_weights = 1, .compress_grads = 1, .unit_policies = 1},
    {.name = "none", .compress_weights = 1, .unit_policies = 1},
    {.name = "hybrid",
     .shards = 1,
     .releases = 1,
     .replicas = 1,
     .group_option = "--shard-group-size",
     .compress_weights = 1,
     .unit_policies = 1,
     .levels = {"shard_group", "replicas"},
     .groups = "shard groups",
     .copies = "replicas"},
    {.name = "hpz",
     .shards = 1,
     .releases = 1,
     .node_copy = 1,
     .group_option = "--node-size",
     .levels = {"world", "node"},
     .groups = "node groups",
     .copies = "nodes"},
};
#define N_STRATEGIES (int)(sizeof table / sizeof *table)

int strategy_parse(const char *name, strategy_t *s)
{
    for (int i = 0; i < N_STRATEGIES; i++)
        if (!strcmp(name, table[i].name)) {
            *s = (strategy_t)i;
            return 0;
        }
    return -1;
}

const char *strategy_name(strategy_t s) { return table[s].name; }
const strategy_traits_t *strategy_traits(strategy_t s) { return &table[s]; }

strategy_use_t strategy_use(strategy_t s)
{
    return (strategy_use_t){.strategy = s, .compress_weights = -1, .compress_grads = -1, .precision = -1};
}

/* A group size given for a strategy it does not size: the message names the strategy it is for. */
static int group_option_check(const strategy_traits_t *t, const char *option, int64_t given)
{
    if (!given || (t->group_option && !strcmp(t->group_option, option)))
        return 0;
    for (int i = 0; i < N_STRATEGIES; i++)
        if (table[i].group_option && !strcmp(table[i].group_option, option)) {
            ftk_err_set("%s is for --strategy %s", option, table[i].name);
            return -1;
        }
    ftk_err_set("%s is for no --strategy", option);
    return -1;
}

/* "full or grad-op": the strategies that take --compress-grads. */
static void compress_grads_names(char *out, size_t cap)
{
    int n = 0, k = 0;
    for (int i = 0; i < N_STRATEGIES; i++)
        n += table[i].compress_grads;
    out[0] = 0;
    for (int i = 0; i < N_STRATEGIES; i++)
        if (table[i].compress_grads) {
            size_t used = strlen(out);
            snprintf(out + used, cap - used, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", table[i].name);
            k++;
        }
}

static int compress_grads_check(const strategy_use_t *u, const strategy_traits_t *t)
{
    const char *arg = compress_grads_name(u->compress_grads);
    if (!t->compress_grads) {
        char names[128];
        compress_grads_names(names, sizeof names);
        ftk_err_set("--compress-grads %s: for --strategy %s (not %s)", arg, names, t->name);
        return -1;
    }
    if (precision_dtypes((precision_t)u->precision).grad != DT_F32) {
        ftk_err_set("--compress-grads %s: the gradients are bf16 already under --precision %s", arg,
                    precision_name((precision_t)u->precision));
        return -1;
    }
    return 0;
}

int strategy_check(const strategy_use_t *u)
{
    const strategy_traits_t *t = strategy_traits(u->strategy);
    if (group_option_check(t, "--shard-group-size", u->group_size) < 0 ||
        group_option_check(t, "--node-size", u->node_size) < 0)
        return -1;
    if (!u->units)
        return 0;
    char canonical[32];
    const char *units = u->units_text;
    if (!units) {
        units_name(u->units, canonical);
        units = canonical;
    }
    if (!t->unit_policies && u->units->kind != CKPT_UNITS_BLOCK) {
        ftk_err_set("--units %s: --strategy %s takes --units block only", units, t->name);
        return -1;
    }
    if (u->compress_weights < 0 || u->compress_grads < 0)
        return 0;
    if ((u->compress_weights || u->compress_grads) && u->units->kind != CKPT_UNITS_BLOCK) {
        ftk_err_set("--units %s: --compress-weights and --compress-grads take --units block only", units);
        return -1;
    }
    if (u->compress_weights && !t->compress_weights) {
        ftk_err_set("--compress-weights %s: not with --strategy %s", compress_weights_name(u->compress_weights),
                    t->name);
        return -1;
    }
    if (u->precision < 0 || !u->compress_grads)
        return 0;
    return compress_grads_check(u, t);
}

int strategy_choose(const strategy_words_t *w, strategy_choice_t *c)
{
    if (strategy_parse(w->strategy, &c->strategy) < 0) {
        ftk_err_set("--strategy %s: need full, grad-op, none, hybrid or hpz", w->strategy);
        return -1;
    }
    strategy_use_t use = strategy_use(c->strategy);
    use.group_size = w->group_size;
    use.node_size = w->node_size;
    if (strategy_check(&use) < 0)
        return -1;
    if (units_parse(w->units, &c->units) < 0) {
        ftk_err_prefix("--units %s: ", w->units);
        return -1;
    }
    use.units = &c->units;
    use.units_text = w->units;
    if (strategy_check(&use) < 0)
        return -1;
    if (compress_parse_weights(w->compress_weights, &c->compress_weights) < 0 ||
        compress_parse_grads(w->compress_grads, &c->compress_grads) < 0)
        return -1;
    use.compress_weights = c->compress_weights;
    use.compress_grads = c->compress_grads;
    if (strategy_check(&use) < 0)
        return -1;
    if (precision_parse(w->precision, &c->precision) < 0) {
        ftk_err_set("--precision %s: need fp32, bf16-mixed or bf16-true", w->precision);
        return -1;
    }
    use.precision = c->precision;
    if (strategy_check(&use) < 0)
        return -1;
    c->group_size = (int)(strategy_traits(c->strategy)->node_copy ? w->node_size : w->group_size);
    return 0;
}
