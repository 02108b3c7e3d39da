/* probe_model — exposes one forward/backward pass of the model for the reference tests
 * (tests/ref/model_vs_torch.py). Not a unit test (no test_ prefix): run by hand or by
 * the reference tests.
 *
 *   probe_model [--precision fp32|bf16-mixed|bf16-true] WEIGHTS.h5 DATA.h5 OUT.h5 ROW...
 *
 * Builds one batch from the given training rows of DATA.h5 and writes to OUT.h5:
 * /logits [n, vocab] (every position), /loss (mean over the targets), /n_targets, and
 * /grads/<HF tensor name>: the gradient of that mean loss, widened to float32 (in the
 * mode's gradient dtype before that). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/model.h"
#include "../../formats/h5.h"
#include "../../formats/weights.h"
#include "../../libcommon/log.h"

static int die(const char *what)
{
    fprintf(stderr, "probe_model: %s: %s\n", what, ftk_err_msg());
    return 1;
}

int main(int argc, char **argv)
{
    precision_t prec = PREC_FP32;
    if (argc > 2 && !strcmp(argv[1], "--precision")) {
        if (precision_parse(argv[2], &prec) < 0) {
            fprintf(stderr, "probe_model: --precision %s: need fp32, bf16-mixed or bf16-true\n", argv[2]);
            return 2;
        }
        argv += 2;
        argc -= 2;
    }
    if (argc < 5) {
        fprintf(stderr, "usage: probe_model [--precision P] WEIGHTS.h5 DATA.h5 OUT.h5 ROW...\n");
        return 2;
    }
    if (h5_init() < 0)
        return die("hdf5");
    model_config_t cfg;
    hid_t wf = weights_open(argv[1], &cfg);
    if (wf < 0)
        return die(argv[1]);
    hid_t df = h5_open(argv[2], TOKENS_FORMAT, TOKENS_VERSION, NULL, NULL);
    tokens_split_t s;
    if (df < 0 || tokens_read_split(df, "train", &s) < 0)
        return die(argv[2]);
    int nr = argc - 4;
    int64_t *rows = malloc((size_t)nr * sizeof *rows);
    for (int i = 0; i < nr; i++)
        rows[i] = atoll(argv[4 + i]);
    batch_t b = {0};
    if (batch_add_rows(&b, &s, rows, nr) < 0)
        return die("batch");
    backend_t *be = backend_cpu_new();
    model_t *m = be ? model_new(be, &cfg, prec, 1, b.n, 0) : NULL;
    if (!m || model_load_weights(m, wf) < 0)
        return die("model");
    float *logits = malloc((size_t)(b.n * cfg.vocab_size) * sizeof *logits);
    model_step(m, &b, 0.0f, logits);
    model_zero_grad(m);
    double loss = model_step(m, &b, 1.0f / (float)b.n_tgt, NULL) / (double)b.n_tgt;

    hid_t out = h5_create(argv[3], "probe", 1);
    if (out < 0)
        return die(argv[3]);
    hsize_t d2[2] = {(hsize_t)b.n, (hsize_t)cfg.vocab_size}, d1[1] = {1};
    int64_t nt = b.n_tgt;
    if (h5w_write_tensor(out, "logits", H5T_NATIVE_FLOAT, 2, d2, logits, NULL, NULL) < 0 ||
        h5w_write_tensor(out, "loss", H5T_NATIVE_DOUBLE, 1, d1, &loss, NULL, NULL) < 0 ||
        h5w_write_tensor(out, "n_targets", H5T_NATIVE_INT64, 1, d1, &nt, NULL, NULL) < 0)
        return die("write");
    hid_t g = h5_group_create(out, "grads");
    int nu;
    const ckpt_unit_t *u = model_units(m, &nu);
    for (int i = 0; i < nu; i++) {
        bk_buf_t gb = model_unit_grad(m, i);
        size_t es = dtype_size(gb.dt);
        void *raw = malloc((size_t)u[i].padded * es);
        float *g32 = malloc((size_t)u[i].padded * sizeof *g32);
        if (!raw || !g32)
            return die("out of memory");
        be->download(be, raw, gb.p, (size_t)u[i].padded * es);
        dtype_convert(g32, DT_F32, raw, gb.dt, (size_t)u[i].padded);
        for (int k = 0; k < u[i].n_tensors; k++) {
            const ckpt_tensor_t *t = &u[i].t[k];
            hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
            if (h5w_write_tensor(g, t->name, H5T_NATIVE_FLOAT, t->rank, dims, g32 + t->offset, NULL, NULL) < 0)
                return die(t->name);
        }
        free(raw);
        free(g32);
    }
    H5Gclose(g);
    h5_close(out);
    printf("tokens %lld, segments %lld, targets %lld, loss %.9g\n", (long long)b.n, (long long)b.n_seg,
           (long long)b.n_tgt, loss);
    free(logits);
    free(rows);
    batch_free(&b);
    model_free(m);
    backend_free(be);
    tokens_split_free(&s);
    h5_close(df);
    h5_close(wf);
    return 0;
}
