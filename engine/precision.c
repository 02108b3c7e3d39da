/* precision.c — precision mode names and dtypes (precision.h). */
#include "precision.h"

#include <string.h>

static const char *const names[] = {"fp32", "bf16-mixed", "bf16-true"};

int precision_parse(const char *name, precision_t *p)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) {
            *p = (precision_t)i;
            return 0;
        }
    return -1;
}

const char *precision_name(precision_t p) { return (unsigned)p < 3 ? names[p] : "?"; }

precision_dtypes_t precision_dtypes(precision_t p)
{
    switch (p) {
    case PREC_BF16_MIXED:
        return (precision_dtypes_t){DT_BF16, DT_F32, DT_F32, DT_BF16};
    case PREC_BF16_TRUE:
        return (precision_dtypes_t){DT_BF16, DT_BF16, DT_BF16, DT_BF16};
    default:
        return (precision_dtypes_t){DT_F32, DT_F32, DT_F32, DT_F32};
    }
}
