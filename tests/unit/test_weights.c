/* Unit tests of the weights-stage modules: dtype conversions, the safetensors writer and
 * reader against each other, config presets and parameter names, size parsing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../libcommon/dtype.h"
#include "../../formats/hfconfig.h"
#include "../../formats/safetensors.h"
#include "../../formats/weights.h"
#include "../../libcommon/log.h"
#include "../../libcommon/opts.h"
#include "test.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_dtype(void)
{
    int bad16 = 0, badbf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        int nan = ((h & 0x7c00) == 0x7c00) && (h & 0x3ff);
        if (nan ? !isnan(f) || (f32_to_f16(f) & 0x7fff) <= 0x7c00 : f32_to_f16(f) != h)
            bad16++;
        float g = bf16_to_f32((uint16_t)h);
        int bnan = ((h & 0x7f80) == 0x7f80) && (h & 0x7f);
        if (bnan ? !isnan(g) : f32_to_bf16(g) != h)
            badbf++;
    }
    CHECK(bad16 == 0); /* every float16 survives f16 -> f32 -> f16 */
    CHECK(badbf == 0); /* every bfloat16 survives bf16 -> f32 -> bf16 */
    CHECK(f32_to_f16(65504.0f) == 0x7bff);
    CHECK(f32_to_f16(65519.0f) == 0x7bff);
    CHECK(f32_to_f16(65520.0f) == 0x7c00); /* the tie above the largest half goes to inf */
    CHECK(f32_to_f16(0x1p-24f) == 0x0001);  /* smallest subnormal */
    CHECK(f32_to_f16(0x1p-25f) == 0x0000);  /* halfway to it: ties to even (zero) */
    CHECK(f32_to_f16(0x1.8p-24f) == 0x0002); /* 1.5 steps: ties to even (2) */
    CHECK(f32_to_f16(-0.0f) == 0x8000);
    CHECK(f32_to_bf16(1.0f) == 0x3f80);
    CHECK(f32_to_bf16(bf16_to_f32(0x3f80) + 0x1p-8f) == 0x3f80); /* tie to even: down */
    CHECK(f32_to_bf16(bf16_to_f32(0x3f81) + 0x1p-8f) == 0x3f82); /* tie to even: up */
    CHECK(f32_to_bf16(3.4e38f) == 0x7f80);                       /* rounds up to inf */
    CHECK((f32_to_bf16(nanf("")) & 0x7fff) > 0x7f80);
    CHECK(fbits(bf16_to_f32(0x8000)) == 0x80000000u);
    CHECK(dtype_parse("bf16") == DT_BF16 && dtype_parse("float16") == DT_F16 && dtype_parse("x") == DT_INVALID);
    uint64_t nan = 0, inf = 0;
    float v[4] = {1.0f, INFINITY, NAN, -INFINITY};
    dtype_count_nonfinite(v, DT_F32, 4, &nan, &inf);
    CHECK(nan == 1 && inf == 2);
}

static void test_safetensors(void)
{
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[0] = {};
    st_entry_t e[3] = {{"a.weight", DT_F32, 2, s1}, {"b", DT_BF16, 1, s2}, {"scalar", DT_F16, 0, s3}};
    buf_t b = {0};
    uint64_t data_len = 0;
    CHECK(st_build_header(&b, e, 3, &data_len) == 0);
    CHECK(data_len == 3 * 5 * 4 + 7 * 2 + 2);
    CHECK(b.len % 8 == 0); /* header padded as the reference writer does */
    size_t hdr = b.len;
    buf_reserve(&b, data_len);
    memset(b.data + b.len, 0, data_len);
    b.len += data_len;
    st_header_t h;
    CHECK(st_parse_buffer((const uint8_t *)b.data, b.len, &h) == 0);
    CHECK(h.n == 3 && h.header_len == hdr - 8 && h.data_len == data_len);
    if (h.n == 3) {
        CHECK(strcmp(h.tensors[0].name, "a.weight") == 0 && h.tensors[0].rank == 2 && h.tensors[0].shape[1] == 5);
        CHECK(h.tensors[1].dt == DT_BF16 && h.tensors[1].begin == 60 && h.tensors[1].end == 74);
        CHECK(h.tensors[2].rank == 0 && h.tensors[2].n_elems == 1);
    }
    st_header_free(&h);
    /* One byte short, one byte long: both refused. */
    CHECK(st_parse_buffer((const uint8_t *)b.data, b.len - 1, &h) < 0);
    CHECK(strstr(ftk_err_msg(), "scalar") != NULL); /* names the tensor */
    buf_putc(&b, 0);
    CHECK(st_parse_buffer((const uint8_t *)b.data, b.len, &h) < 0);
    buf_free(&b);
    CHECK(st_parse_buffer((const uint8_t *)"\x02\0\0\0\0\0\0\0{}", 10, &h) == 0 && h.n == 0);
    st_header_free(&h);
}

static void test_config(void)
{
    model_config_t c;
    CHECK(model_preset("llama2-7b", &c) == 0);
    CHECK(model_n_params(&c) == INT64_C(6738415616)); /* Llama-2-7B's published count */
    CHECK(model_preset("llama-1b", &c) == 0);
    CHECK(model_n_params(&c) == INT64_C(1100048384)); /* TinyLlama-1.1B's */
    CHECK(model_preset("stories260k", &c) == 0 && model_n_params(&c) == 260032);
    CHECK(model_preset("nope", &c) < 0);
    /* Every canonical name is found at its own index; near misses are not. */
    CHECK(model_preset("tiny", &c) == 0);
    size_t n = weights_n_tensors(&c), found = 0;
    for (size_t i = 0; i < n; i++) {
        weights_spec_t s;
        weights_tensor_spec(&c, i, &s);
        found += weights_find(&c, s.name) == (long)i;
    }
    CHECK(found == n && n == 21);
    CHECK(weights_find(&c, "model.layers.2.mlp.up_proj.weight") < 0);
    CHECK(weights_find(&c, "model.layers.01.mlp.up_proj.weight") < 0);
    CHECK(weights_find(&c, "model.layers.1.mlp.up_proj.bias") < 0);
    c.tie_word_embeddings = 1;
    CHECK(weights_find(&c, "lm_head.weight") < 0 && weights_n_tensors(&c) == 20);
    /* config.json: written, parsed back equal. */
    buf_t b = {0};
    CHECK(model_preset("llama2-7b", &c) == 0 && hfconfig_write(&b, &c, DT_BF16) == 0);
    model_config_t d;
    CHECK(hfconfig_parse(b.data, b.len, &d) == 0);
    CHECK(d.hidden_size == 4096 && d.intermediate_size == 11008 && d.rms_norm_eps == 1e-5 && d.rope_theta == 10000.0 &&
          d.torch_dtype == DT_BF16 && !d.tie_word_embeddings && d.bos_token_id == 1 && d.eos_token_id == 2);
    buf_free(&b);
}

static void test_sizes(void)
{
    uint64_t v;
    CHECK(opts_parse_size("5GB", &v) == 0 && v == 5000000000ull);
    CHECK(opts_parse_size("2GiB", &v) == 0 && v == 2147483648ull);
    CHECK(opts_parse_size("500MB", &v) == 0 && v == 500000000ull);
    CHECK(opts_parse_size("123", &v) == 0 && v == 123);
    CHECK(opts_parse_size("5XB", &v) < 0 && opts_parse_size("", &v) < 0 && opts_parse_size("-1GB", &v) < 0);
}

int main(void)
{
    test_dtype();
    test_safetensors();
    test_config();
    test_sizes();
    TEST_END();
}
