/* test.h — the smallest test harness: CHECK(cond) counts and reports; TEST_END returns. */
#ifndef FTK_TEST_H
#define FTK_TEST_H
#include <stdio.h>
static int test_n, test_bad;
#define CHECK(c)                                                                                             \
    do {                                                                                                     \
        test_n++;                                                                                            \
        if (!(c)) {                                                                                          \
            test_bad++;                                                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);                            \
        }                                                                                                    \
    } while (0)
/* n checks made elsewhere (a shared helper's count), bad of them failed (told there) */
#define CHECK_MANY(n, bad)                                                                                   \
    do {                                                                                                     \
        test_n += (n);                                                                                       \
        test_bad += (bad);                                                                                   \
    } while (0)
#define TEST_END()                                                                                           \
    do {                                                                                                     \
        printf("%d of %d checks passed\n", test_n - test_bad, test_n);                                       \
        return test_bad ? 1 : 0;                                                                             \
    } while (0)
#endif
