/* strategy.h — the sharding strategies' names (docs/design.md "Sharding strategies"), apart
 * from engine/shard so that tools without MPI (ftk-reshard) can parse and print them. */
#ifndef FTK_STRATEGY_H
#define FTK_STRATEGY_H

typedef enum { STRAT_FULL, STRAT_GRAD_OP, STRAT_NONE, STRAT_HYBRID, STRAT_HPZ } strategy_t;

/* "full", "grad-op", "none", "hybrid", "hpz" → 0 and *s; -1 for anything else. */
int strategy_parse(const char *name, strategy_t *s);
const char *strategy_name(strategy_t s);

#endif
