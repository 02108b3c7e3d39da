/* plural.h — "1 step", "2 steps": counts in messages take the noun's right form.
 * Use as printf("%lld step%s", (long long)n, plural_s(n)). */
#ifndef FTK_PLURAL_H
#define FTK_PLURAL_H

static inline const char *plural_s(long long n) { return n == 1 ? "" : "s"; }

#endif
