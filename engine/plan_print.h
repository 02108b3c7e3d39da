/* plan_print.h — the memory plan as `ftk-train --plan` prints it: the plan of every rank
 * planned for (plan.h plan_memory), rank 0's table with its largest rank named, and, where
 * --recompute auto found no level that fits, the refusal with what would fit.
 *
 * plan_table_make() reads the model's configuration (a weights file or a preset) and, when
 * given, the data's row length and segments; it writes nothing. It returns 0, or -1 with
 * ftk_err_msg() set to the message the tool prints (exit 2: every failure is the input's).
 * plan_table_print() writes the table; plan_table_refusal() words the refusal.
 */
#ifndef FTK_PLAN_PRINT_H
#define FTK_PLAN_PRINT_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plan.h"
#include "trainer.h"

/* What --plan was asked for (the strings borrowed for the table's life). */
typedef struct {
    trainer_opts_t o;           /* the run's options, as for trainer_new */
    const char *preset;         /* a named model shape (hfconfig.h model_preset), or NULL: */
    const char *model_path;     /* the weights file whose configuration is planned */
    const char *data_path;      /* token data (its max_len, its segments a micro-batch), or NULL */
    int64_t max_len;            /* tokens per row; 0: the data's */
    int ranks;                  /* the world planned for */
    const char *device;         /* "cpu" or "cuda" */
    const char *strategy_name;  /* --strategy and --precision as given, for the header */
    const char *precision_name;
} plan_request_t;

typedef struct {
    plan_request_t rq;
    plan_opts_t p;        /* what was planned */
    int64_t budget;       /* --recompute auto's device bytes (0: not auto) */
    plan_t rank0, most;   /* rank 0's plan (the table's); the plan with the largest total */
    int fits;             /* every rank fits the budget (auto) */
    plan_t unfit;         /* the first rank that does not (fits 0) */
} plan_table_t;

int plan_table_make(const plan_request_t *rq, plan_table_t *t);
void plan_table_print(FILE *out, const plan_table_t *t);

/* 1 and the refusal's message in out (n bytes) when --recompute auto was asked for and no
 * level fits; 0 otherwise. */
int plan_table_refusal(const plan_table_t *t, char *out, size_t n);

/* The whole of --plan: the table made and printed on out, then the refusal where there is
 * one (out flushed before it is said). Returns 0, or -1 with the message in why (n bytes):
 * the failure of plan_table_make, or the refusal. */
int plan_table_run(const plan_request_t *rq, FILE *out, char *why, size_t n);

#endif
