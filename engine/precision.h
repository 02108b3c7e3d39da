/* precision.h — the precision modes of training (docs/design.md "Precision modes"): which
 * dtype each kind of state is stored in. Apart from the model and the sharding engine so
 * that tools without them (ftk-reshard) parse and print the names the same way.
 *
 *   mode        weights the ops read   master / state (p, m, v)   gradients   activations
 *   fp32        f32                    f32                        f32         f32
 *   bf16-mixed  bf16 working copy      f32 (master weights)       f32         bf16
 *   bf16-true   bf16                   bf16                       bf16        bf16
 *
 * A checkpoint stores the state dtype (formats/checkpoint.h ckpt_state_dtype()).
 * Activations are always in the compute dtype: a product takes one dtype for both
 * operands (kernels/backend.h), and the model multiplies activations by weights.
 */
#ifndef FTK_PRECISION_H
#define FTK_PRECISION_H

#include "../libcommon/dtype.h"

typedef enum { PREC_FP32, PREC_BF16_MIXED, PREC_BF16_TRUE } precision_t;

typedef struct {
    dtype_t compute; /* the weights the ops read (gathered units) */
    dtype_t state;   /* owned weights (the master in bf16-mixed) and AdamW moments */
    dtype_t grad;    /* gradients: accumulated, reduced, read by AdamW */
    dtype_t act;     /* activations and their gradients */
} precision_dtypes_t;

/* "fp32", "bf16-mixed", "bf16-true" → 0 and *p; -1 for anything else. */
int precision_parse(const char *name, precision_t *p);
const char *precision_name(precision_t p);
precision_dtypes_t precision_dtypes(precision_t p);

#endif
