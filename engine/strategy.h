/* strategy.h — the sharding strategies (docs/design.md "Sharding strategies", shard.h) as
 * data: one row of traits per strategy, which the shard engine, the report and the tools
 * read instead of naming strategies, and the rules on the options that go with one. Apart
 * from engine/shard so that tools without MPI (ftk-reshard) can parse, print and check
 * them. A new strategy is a row of strategy.c's table (and its enum value here).
 *
 * The traits point into a static table (never freed); strategy_check returns 0, or -1 with
 * ftk_err_msg() set. */
#ifndef FTK_STRATEGY_H
#define FTK_STRATEGY_H
#include <stdint.h>

#include "precision.h"
#include "units.h"

typedef enum { STRAT_FULL, STRAT_GRAD_OP, STRAT_NONE, STRAT_HYBRID, STRAT_HPZ } strategy_t;

/* "full", "grad-op", "none", "hybrid", "hpz" → 0 and *s; -1 for anything else. */
int strategy_parse(const char *name, strategy_t *s);
const char *strategy_name(strategy_t s);

typedef struct {
    const char *name;
    /* Parameters, gradients and AdamW state are cut into S slices, one a rank (gathered
     * before use, gradients reduce-scattered); 0: replicated, gradients all-reduced (DDP). */
    int shards;
    /* A gathered unit is released after each use and gathered again for the backward; 0:
     * kept from its first use to the optimizer step (grad-op). */
    int releases;
    /* Shard groups of S ranks smaller than the world, replicated across the world: after the
     * step's last micro-batch each slice's gradient is all-reduced across the replicas. */
    int replicas;
    /* A secondary copy of the weights, sharded inside each node group, serves every gather
     * but a unit's first after the weights change (hpz.h). */
    int node_copy;
    /* The option that sizes the replicas' shard groups or the node groups ("--shard-group-size",
     * "--node-size"; by default the ranks of a node), or NULL where there are none. */
    const char *group_option;
    int compress_weights; /* takes --compress-weights (which changes nothing where nothing is gathered) */
    int compress_grads;   /* takes --compress-grads: reduce-scatters whose residual its checkpoint keeps */
    int unit_policies;    /* takes --units other than block */
    /* The report (report.h): the names of its two levels of communication, the group's and
     * the replicas' or node's (NULL: one level, "world"); on other rank counts, what it keeps
     * ("shard groups") and what n/size of them counts ("replicas"). */
    const char *levels[2];
    const char *groups, *copies;
} strategy_traits_t;

const strategy_traits_t *strategy_traits(strategy_t s);

/* What a run asks of a strategy, for strategy_check. group_size and node_size are the options
 * as given (0: not given); the other fields are unknown until set (strategy_use() leaves them
 * so): a caller that parses its options one at a time asks after each, and the first rule
 * broken is in the order of its options. --compress-grads is judged once the precision is
 * known, as both its rules read the gradients. */
typedef struct {
    strategy_t strategy;
    int64_t group_size, node_size; /* --shard-group-size, --node-size */
    const units_policy_t *units; /* NULL: not known */
    const char *units_text;      /* --units as given, for the messages (NULL: units_name's) */
    int compress_weights;        /* COMPRESS_* (compress.h), -1: not known */
    int compress_grads;          /* COMPRESS_*, -1: not known */
    int precision;               /* precision_t, -1: not known */
} strategy_use_t;

strategy_use_t strategy_use(strategy_t s);
/* The rules, in the order ftk-train gives its options: a group size only for the strategy it
 * sizes; --units block only under a strategy without unit policies; compression only with
 * --units block and where the strategy takes it; --compress-grads only where the gradients are
 * fp32. The message names the options as given. */
int strategy_check(const strategy_use_t *u);

/* A run's strategy and the options that go with it, from their words as given (ftk-train's
 * --strategy, --units, --compress-weights, --compress-grads and --precision, with
 * --shard-group-size and --node-size), each parsed and checked (strategy_check) in that
 * order, so that of two faults the first is the one told. */
typedef struct {
    const char *strategy, *units, *compress_weights, *compress_grads, *precision;
    int64_t group_size, node_size; /* 0: not given */
} strategy_words_t;

typedef struct {
    strategy_t strategy;
    units_policy_t units;
    int compress_weights, compress_grads; /* COMPRESS_* (compress.h) */
    precision_t precision;
    int group_size; /* the strategy's group option's value (--node-size under a node copy) */
} strategy_choice_t;

/* 0 with *c filled, or -1 with ftk_err_msg() saying what is wrong, in the options' words. */
int strategy_choose(const strategy_words_t *w, strategy_choice_t *c);

#endif
