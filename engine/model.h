/* model.h — the Llama model, written once against the backend interface (kernels/backend.h).
 *
 * Forward: embedding; per block x += attn(rmsnorm(x)), x += mlp(rmsnorm(x)) with
 * attention = q/k/v projections, HF rotary embedding (rope_theta), causal grouped-query
 * attention inside each segment (sample), output projection; MLP = down(silu(gate)·up);
 * final RMSNorm; head (lm_head, or the embedding when tied); cross-entropy on the targets
 * only. The head and the loss run on chunks of target rows (model_t.head_chunk), so the
 * full [tokens, vocab] logits never exist.
 *
 * Parameters live in the units of the shard map (formats/checkpoint.h): one flat vector
 * per unit, so the optimizer and the checkpoint see flat arrays. Gradients mirror them.
 *
 * Precision (precision.h): the units the model reads are in the mode's compute dtype,
 * the gradients it adds into in its gradient dtype, activations and their gradients in
 * its activation dtype. In the bf16 modes the head's logits are fp32 (the loss is
 * computed in fp32) and the loss gradient is rounded to bf16 for the head's backward
 * products.
 * Either the model owns them (model_new: one full copy, for one process and for
 * generation) or a sharding engine lends them unit by unit through a model_io_t
 * (model_new_io, engine/shard.h), which is how ZeRO-3 keeps only the units in use whole.
 *
 * Ownership: model_new() allocates everything on the backend up front (parameters,
 * gradients, activations for max_tokens tokens, the loss accumulator; bk_alloc classes
 * weights, gradients, activations, other); nothing is allocated per step.
 * Functions return 0 / a pointer, or -1 / NULL with ftk_err_msg() set.
 */
#ifndef FTK_MODEL_H
#define FTK_MODEL_H
#include <stdint.h>

#include "../formats/checkpoint.h"
#include "../formats/tokens.h"
#include "../kernels/backend.h"
#include "loader.h"
#include "precision.h"

typedef struct model model_t;

/* Where a model's units live when it does not own them. model_pass() calls, in this
 * order for a training pass (forward then backward):
 *   params(0) [release(0) unless the head is tied], for each block l: params(1+l),
 *   release(1+l); params(H) [params(0) when tied]; grads(H) [grads(0) when tied];
 *   release(H) [release(0)]; grads_done(H); for each block from the last: params(1+l),
 *   grads(1+l), release(1+l), grads_done(1+l); grads(0), grads_done(0)
 * (H = the head unit, n_units − 1; a forward-only pass stops after release(H)).
 * params() returns the unit's whole parameter vector, valid until release(); grads()
 * returns a whole-unit buffer the pass ADDS its gradient into, the same buffer until
 * grads_done(), after which the model does not touch it.
 * grads_first (optional; NULL: never), asked after grads(u): 1 when the buffer holds
 * nothing of the step yet, so the pass WRITES the unit's gradient instead of adding into
 * it — its first product into each tensor with beta = 0, the embedding and norm weights
 * zeroed before their scatter-adds (a tied head's product writes the table) — which
 * spares the whole-model memset of the gradients at every step. The unit's padding is
 * never written: the buffer's owner keeps it zero. */
typedef struct {
    void *ctx;
    void *(*params)(void *ctx, int unit); /* compute dtype */
    void (*release)(void *ctx, int unit);
    void *(*grads)(void *ctx, int unit);  /* gradient dtype */
    void (*grads_done)(void *ctx, int unit);
    int (*grads_first)(void *ctx, int unit);
} model_io_t;

/* How much of a block's forward pass the backward pass runs again instead of keeping
 * (each level gives the same bits: the same ops on the same values):
 *   NONE:  every activation kept, per block;
 *   NORMS: the products' and attention's outputs kept per block (q, k, v after rope, the
 *          attention output and its log-sum-exp, the residual sum xmid, the gate and up
 *          products); the two RMSNorm outputs and the SwiGLU output recomputed from them
 *          (one buffer shared by the blocks). Rope is not recomputed: its input and output
 *          are the same size, so redoing it would save no memory;
 *   BLOCK: only each block's input kept; the whole block run again in its backward pass
 *          (one set of buffers shared by the blocks).
 * The values are the historical 0/1 of the flag, NORMS after them. */
typedef enum { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_BLOCK = 1, MODEL_RECOMPUTE_NORMS = 2 } model_recompute_t;

/* training: allocate gradients and activations for up to max_tokens tokens per call;
 * recompute: a model_recompute_t. */
model_t *model_new(backend_t *be, const model_config_t *c, precision_t prec, int training, int64_t max_tokens,
                   int recompute);
/* A training model whose units (padded for the caller's shard count) come through io. */
model_t *model_new_io(backend_t *be, const model_config_t *c, precision_t prec, int64_t max_tokens, int recompute,
                      const ckpt_unit_t *units, int n_units, const model_io_t *io);
void model_free(model_t *m);
backend_t *model_backend(const model_t *m);
const ckpt_unit_t *model_units(const model_t *m, int *n_units);
precision_dtypes_t model_dtypes(const model_t *m);
/* Backend memory, units[u].padded elements (compute dtype, gradient dtype); NULL for a
 * model_new_io() model. */
bk_buf_t model_unit_param(model_t *m, int u);
bk_buf_t model_unit_grad(model_t *m, int u);

/* Loads every tensor of a weights file (any stored dtype) into the parameters
 * (model_new() models), rounded to nearest even where the compute dtype is bf16. */
int model_load_weights(model_t *m, hid_t file);

void model_zero_grad(model_t *m);

/* Issues the forward pass over a batch, and with grad_scale != 0 the backward pass, which
 * ADDS grad_scale·∂(Σ weight·loss)/∂θ to the gradients (writes it into those whose
 * model_io_t grads_first says so). Σ weight·loss over the batch's
 * targets is ADDED to the model's loss accumulator, a double on the device (backend.h
 * xent): the pass does not wait for the device (only the batch's uploads block, as
 * upload does). With logits != NULL (host, [n, vocab]) the logits of every position are
 * written there (forward only; for tests). 0, or -1 with ftk_err_msg() set when the batch
 * is larger than model_new()'s max_tokens or the model was made for inference. */
int model_pass(model_t *m, const batch_t *b, float grad_scale, float *logits);
/* The loss accumulated since the last take, brought back (the host waits for the passes
 * issued), and the accumulator zeroed: a training step takes it once, after its last
 * micro-batch. The chunks' losses of every pass are added in order into one double, so
 * the value is that of one running sum over the step's chunks. NaN for a model made for
 * inference, or when the backend has failed (its sync() says why). */
double model_loss_take(model_t *m);
/* The passes add their loss into acc (one double in the backend's memory, zero; the
 * caller keeps it so and owns it) instead of the model's own accumulator: the trainer
 * brings the loss back with the step's Σg² in one download (engine/optim.h). NULL: the
 * model's own again. model_loss_take() then takes from acc. */
void model_set_loss_acc(model_t *m, double *acc);
/* model_pass, then model_loss_take: the batch's Σ weight·loss (when nothing was pending),
 * or NaN with ftk_err_msg() set. For callers that want one pass's loss (tests, probes). */
double model_step(model_t *m, const batch_t *b, float grad_scale, float *logits);

/* Incremental decoding with a key/value cache of ctx positions (ftk-generate;
 * model_new() models). */
typedef struct model_kv model_kv_t;
model_kv_t *model_kv_new(model_t *m, int64_t ctx);
void model_kv_free(model_t *m, model_kv_t *kv);
/* Runs ids[0..n) at positions p0 … p0+n-1 of the cached sequence and writes the logits of
 * the last one to logits (host, vocab floats). */
int model_decode(model_t *m, model_kv_t *kv, const int32_t *ids, int64_t n, int64_t p0, float *logits);

#endif
