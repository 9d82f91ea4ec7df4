/* embed.c — --embedding's and --rerank's tasks in the engine, and the
 * normalisation of their vectors.
 *
 * The tasks go through the same queue, admission and slots as chat
 * (engine.c's admit hands an EMBED or RERANK task to embed_start instead of
 * slot_start); only the decode differs:
 *   - a prompt is decoded whole, in one micro-batch: pooling (mean, cls,
 *     last, rank) sees only the tokens of the micro-batch it runs in, and an
 *     encoder (BERT: no KV memory) cannot split a sequence at all (libllama
 *     asserts n_tokens <= n_ubatch). So a step's batch holds whole prompts
 *     of several slots up to n_ubatch tokens; a prompt that does not fit
 *     waits for the next step (one longer than n_ubatch never gets here:
 *     thaw_engine_submit refuses it);
 *   - every token is an output (what pooling reads; with pooling none, the
 *     per-token vectors are the answer);
 *   - after the decode the vector is copied into the task and the slot's
 *     sequence emptied: nothing is kept, stored or restored (the next
 *     prompt starts at position 0 in an empty sequence).
 */
#include "engine/embed.h"

#include "base/log.h"
#include "engine/engine_state.h"
#include "engine/slotkv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void thaw_embd_normalize(const float *in, float *out, int n, int norm)
{
    double sum = 0.0;

    if (norm < -1)
        norm = -1;
    switch (norm) {
    case -1:
        sum = 1.0;
        break;
    case 0:
        for (int i = 0; i < n; i++)
            if (fabs((double)in[i]) > sum)
                sum = fabs((double)in[i]);
        sum /= 32760.0; /* the largest value becomes 32760: an int16 range */
        break;
    case 2:
        for (int i = 0; i < n; i++)
            sum += (double)in[i] * (double)in[i];
        sum = sqrt(sum);
        break;
    default: /* 1 (taxicab) and p > 2 */
        for (int i = 0; i < n; i++)
            sum += pow(fabs((double)in[i]), (double)norm);
        sum = pow(sum, 1.0 / (double)norm);
        break;
    }
    double scale = sum > 0.0 ? 1.0 / sum : 0.0;
    for (int i = 0; i < n; i++)
        out[i] = (float)((double)in[i] * scale);
}

int thaw_embed_start(struct thaw_engine *e, struct thaw_slot *s, struct thaw_task *t)
{
    thaw_slot_move(s, THAW_SLOT_PREFILL, &(struct thaw_slot_enter){.task = t}, e->metrics);
    thaw_slotkv_clear(e->skv, s); /* an empty sequence: the prompt from position 0, alone */
    s->n_prompt_done = 0;
    thaw_task_started(t, 0, 0, "none");
    LOG_DBG("slot %d: %s of %d tokens", s->id, t->kind == THAW_TASK_RERANK ? "rank" : "embedding", t->n_prompt);
    return 0;
}

void thaw_embed_build_batch(struct thaw_engine *e)
{
    struct llama_batch *b = &e->batch;
    int cap = e->n_ubatch < e->n_batch ? e->n_ubatch : e->n_batch;

    b->n_tokens = 0;
    e->batch_fixup_only = false;
    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        s->i_batch = -1;
        s->n_in_batch = 0;
        if (s->phase != THAW_SLOT_PREFILL || !s->task || b->n_tokens + s->task->n_prompt > cap)
            continue;
        const struct thaw_task *t = s->task;
        s->i_batch = b->n_tokens;
        for (int p = 0; p < t->n_prompt; p++) {
            int k = b->n_tokens++;
            b->token[k] = t->prompt[p];
            b->pos[k] = p;
            b->n_seq_id[k] = 1;
            b->seq_id[k][0] = s->id;
            b->logits[k] = true;
        }
        s->n_in_batch = t->n_prompt;
    }
}

/* The slot's vectors, malloc'd, into *out (rows x n floats). Returns
 * NULL, or a message for the client. */
static const char *take_vectors(struct thaw_engine *e, const struct thaw_slot *s, float **out, int *rows, int *n)
{
    const struct thaw_task *t = s->task;
    bool per_token = e->pooling == LLAMA_POOLING_TYPE_NONE;
    int width = e->pooling == LLAMA_POOLING_TYPE_RANK ? e->n_cls_out : e->n_embd_out;
    int n_rows = per_token ? t->n_prompt : 1;
    float *v = malloc((size_t)n_rows * (size_t)width * sizeof *v);

    if (!v)
        return "out of memory";
    for (int r = 0; r < n_rows; r++) {
        const float *src = per_token ? llama_get_embeddings_ith(e->ctx, s->i_batch + r)
                                     : llama_get_embeddings_seq(e->ctx, s->id);
        if (!src) {
            free(v);
            return "libllama returned no embedding for this prompt";
        }
        float *dst = v + (size_t)r * (size_t)width;
        /* only a pooled vector is normalised (llama-server's rule); a rank
         * head's outputs are scores */
        if (!per_token && e->pooling != LLAMA_POOLING_TYPE_RANK)
            thaw_embd_normalize(src, dst, width, t->embd_normalize);
        else
            memcpy(dst, src, (size_t)width * sizeof *dst);
    }
    *out = v;
    *rows = n_rows;
    *n = width;
    return NULL;
}

void thaw_embed_after_decode(struct thaw_engine *e, int64_t t0, int64_t t1)
{
    uint64_t n_prompt_tokens = 0;

    for (int i = 0; i < e->n_slots; i++) {
        struct thaw_slot *s = &e->slots[i];
        if (s->phase != THAW_SLOT_PREFILL || s->n_in_batch == 0)
            continue;
        float *v = NULL;
        int rows = 0, n = 0;
        const char *err = take_vectors(e, s, &v, &rows, &n);
        n_prompt_tokens += (uint64_t)s->n_in_batch;
        if (err) {
            LOG_ERR("slot %d: %s", s->id, err);
            thaw_engine_slot_fail(e, s, 500, err);
            continue;
        }
        thaw_task_finish_embd(s->task, v, rows, n);
        thaw_slotkv_clear(e->skv, s); /* nothing is kept: the cells go back */
        thaw_engine_slot_idle(e, s);
    }
    atomic_fetch_add(&e->metrics->prompt_tokens, n_prompt_tokens);
    if (n_prompt_tokens > 0)
        atomic_fetch_add(&e->metrics->prompt_us, (uint64_t)(t1 - t0));
}
