/* Unit tests of the unit of communication (engine/units.h): the policy's text, read and
 * written back (and the manifest's parser it shares, formats/checkpoint.h); the groups each
 * policy makes of stories260K's 5 blocks; the refusals; units_interleave's two layouts on
 * the CPU backend, and that one undoes the other. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/units.h"
#include "../../libcommon/log.h"
#include "test.h"

static int parses(const char *text, int kind, int64_t arg)
{
    units_policy_t p;
    return units_parse(text, &p) == 0 && p.kind == kind && p.arg == arg;
}

static int refused(const char *text)
{
    units_policy_t p;
    return units_parse(text, &p) < 0 && strstr(ftk_err_msg(), "need block, group:M") != NULL;
}

static int named(const char *text, const char *want)
{
    units_policy_t p;
    char out[32];
    if (units_parse(text, &p) < 0)
        return 0;
    units_name(&p, out);
    return !strcmp(out, want);
}

/* "1 2 2 1" style: the blocks of each communication unit, and of[] consistent with it */
static int groups(const char *text, int64_t S, const char *want)
{
    model_config_t c;
    ckpt_unit_t *u;
    int n;
    units_policy_t p;
    units_map_t m;
    if (model_preset("stories260k", &c) < 0 || ckpt_units(&c, S, &u, &n) < 0)
        return 0;
    int ok = units_parse(text, &p) == 0 && units_map(&p, u, n, 4, S, &m) == 0;
    char got[256] = "";
    for (int i = 0; ok && i < m.n; i++) {
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%d", i ? " " : "", m.count[i]);
        for (int k = 0; k < m.count[i]; k++)
            ok &= m.of[m.first[i] + k] == i;
    }
    if (ok)
        units_map_free(&m);
    free(u);
    if (ok && strcmp(got, want))
        fprintf(stderr, "%s: groups %s, expected %s\n", text, got, want);
    return ok && !strcmp(got, want);
}

int main(void)
{
    /* the text */
    CHECK(parses("block", CKPT_UNITS_BLOCK, 1));
    CHECK(parses("", CKPT_UNITS_BLOCK, 1));
    CHECK(parses(NULL, CKPT_UNITS_BLOCK, 1));
    CHECK(parses("group:1", CKPT_UNITS_GROUP, 1));
    CHECK(parses("group:1048576", CKPT_UNITS_GROUP, 1048576));
    CHECK(parses("size:1", CKPT_UNITS_SIZE, 1));
    CHECK(parses("size:2KiB", CKPT_UNITS_SIZE, 2048));
    CHECK(parses("size:600KB", CKPT_UNITS_SIZE, 600000));
    CHECK(parses("size:4611686018427387904", CKPT_UNITS_SIZE, INT64_C(4611686018427387904)));
    const char *bad[] = {"group:0", "group:", "group:-1", "group:+2", "group: 2", "group:2x", "group:1048577",
                         "group:99999999999999999999", "size:0", "size:", "size:abc", "size:-5", "size:1XB",
                         "size:4611686018427387905", "size:99999999999999999999", "blocks", "Block", "group",
                         "size", "group:2:3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(refused(bad[i]));
    CHECK(named("", "block"));
    CHECK(named("group:7", "group:7"));
    CHECK(named("size:1MiB", "size:1048576"));
    CHECK(named("size:1048576", "size:1048576"));

    /* groups of stories260K's 5 blocks (45,440 parameters: 181,760 bytes in fp32), embed and head alone */
    CHECK(groups("block", 2, "1 1 1 1 1 1 1"));
    CHECK(groups("group:1", 2, "1 1 1 1 1 1 1"));
    CHECK(groups("group:2", 2, "1 2 2 1 1"));
    CHECK(groups("group:3", 4, "1 3 2 1"));
    CHECK(groups("group:5", 3, "1 5 1"));
    CHECK(groups("size:1", 2, "1 1 1 1 1 1 1"));   /* less than a block: one block each */
    CHECK(groups("size:363519", 2, "1 1 1 1 1 1 1"));
    CHECK(groups("size:363520", 2, "1 2 2 1 1"));  /* two blocks exactly */
    CHECK(groups("size:600KB", 2, "1 3 2 1"));
    CHECK(groups("size:1GB", 2, "1 5 1"));
    model_config_t c;
    ckpt_unit_t *u;
    int n;
    units_policy_t p;
    units_map_t m;
    CHECK(model_preset("stories260k", &c) == 0 && ckpt_units(&c, 2, &u, &n) == 0);
    CHECK(units_parse("group:6", &p) == 0 && units_map(&p, u, n, 4, 2, &m) < 0 &&
          strstr(ftk_err_msg(), "--units group:6: the model has 5 blocks"));
    /* a group whose per-rank part passes what one collective moves */
    for (int i = 1; i < n - 1; i++)
        u[i].padded = (int64_t)1 << 30;
    CHECK(units_parse("group:2", &p) == 0 && units_map(&p, u, n, 4, 1, &m) < 0 &&
          strstr(ftk_err_msg(), "in one collective"));
    CHECK(units_map(&p, u, n, 4, 2, &m) == 0); /* 2 x 2^29 per rank: fits */
    units_map_free(&m);
    free(u);

    /* the two layouts: 3 blocks, 4 ranks, slices of 5 floats */
    backend_t *be = backend_cpu_new();
    CHECK(be != NULL);
    enum { NB = 3, NS = 4, PART = 5, ALL = NB * NS * PART };
    float src[ALL], mid[ALL], back[ALL];
    for (int i = 0; i < ALL; i++)
        src[i] = (float)i; /* [rank][block][slice]: element (r, k, e) at (r·NB + k)·PART + e */
    units_interleave(be, mid, src, NB, NS, PART * sizeof(float), 1);
    int ok = 1;
    for (int k = 0; k < NB; k++)
        for (int r = 0; r < NS; r++)
            for (int e = 0; e < PART; e++)
                ok &= mid[(k * NS + r) * PART + e] == (float)((r * NB + k) * PART + e);
    CHECK(ok); /* [block][rank][slice] */
    units_interleave(be, back, mid, NB, NS, PART * sizeof(float), 0);
    CHECK(!memcmp(back, src, sizeof src));
    backend_free(be);
    TEST_END();
}
