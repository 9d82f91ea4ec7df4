/* draft.c — the draft model: its context, per-slot sequences, proposals. */
#include "engine/draft.h"

#include "base/error.h"
#include "base/log.h"
#include "llama/kvstate.h"
#include "llama/params.h"
#include "llama/threads.h"
#include "llama/tokens.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dseq {
    llama_token *tokens; /* what the draft sequence holds, n of cap */
    int n, cap;
};

struct thaw_draft {
    struct llama_model *model;
    const struct llama_vocab *vocab;
    struct llama_context *ctx;
    struct thaw_threads *threads; /* its CPU threadpools: the model's placement, the draft's thread counts */
    struct llama_batch batch;
    int n_batch, n_ctx_seq, n_vocab;
    struct dseq *seqs;
    int n_seqs;
};

/* ---- vocabulary check ------------------------------------------------------------ */

/* Same size, type, special tokens and token texts (all of them: a few ms). */
static bool same_vocab(const struct llama_vocab *a, const struct llama_vocab *b, char *why, size_t n_why)
{
    int n = llama_vocab_n_tokens(a);

    if (n != llama_vocab_n_tokens(b)) {
        snprintf(why, n_why, "%d tokens vs the target's %d", llama_vocab_n_tokens(b), n);
        return false;
    }
    if (llama_vocab_type(a) != llama_vocab_type(b)) {
        snprintf(why, n_why, "a different tokenizer type");
        return false;
    }
    if (llama_vocab_bos(a) != llama_vocab_bos(b) || llama_vocab_eos(a) != llama_vocab_eos(b)) {
        snprintf(why, n_why, "different BOS/EOS tokens");
        return false;
    }
    for (llama_token t = 0; t < n; t++) {
        const char *ta = llama_vocab_get_text(a, t), *tb = llama_vocab_get_text(b, t);
        if (strcmp(ta ? ta : "", tb ? tb : "") != 0) {
            snprintf(why, n_why, "token %d differs ('%.20s' vs '%.20s')", (int)t, tb ? tb : "", ta ? ta : "");
            return false;
        }
    }
    return true;
}

/* ---- lifecycle ------------------------------------------------------------------- */

int thaw_draft_new(const struct thaw_config *cfg, const struct llama_model *target, int n_slots,
                   struct thaw_draft **out)
{
    struct thaw_draft *d = calloc(1, sizeof *d);
    char why[160];
    int rc = 0;

    if (!d)
        return THAW_ENOMEM;
    struct llama_model_params mp = llama_model_default_params();
    struct thaw_params pp;
    if ((rc = thaw_params_draft_model(cfg, &pp, &mp)) != 0) /* -ngld, -devd, -otd, ... */
        goto error;
    d->model = llama_model_load_from_file(cfg->draft_path, mp);
    thaw_params_free(&pp);
    if (!d->model) {
        LOG_ERR("llama.cpp could not load the draft model %s", cfg->draft_path);
        rc = THAW_ELLAMA;
        goto error;
    }
    d->vocab = llama_model_get_vocab(d->model);
    if (!same_vocab(llama_model_get_vocab(target), d->vocab, why, sizeof why)) {
        LOG_ERR("draft model %s cannot draft for %s: its vocabulary has %s", cfg->draft_path, cfg->model_path, why);
        rc = THAW_EMISMATCH;
        goto error;
    }
    if (llama_model_is_recurrent(d->model) || llama_model_is_hybrid(d->model)) {
        LOG_ERR("draft model %s is recurrent: it cannot roll back rejected drafts; use an attention model",
                cfg->draft_path);
        rc = THAW_EMISMATCH;
        goto error;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(cfg->n_ctx_draft ? cfg->n_ctx_draft : cfg->n_ctx);
    cp.n_batch = (uint32_t)cfg->n_batch;
    cp.n_ubatch = (uint32_t)cfg->n_ubatch;
    cp.n_seq_max = (uint32_t)n_slots;
    cp.n_threads = cfg->draft_threads ? cfg->draft_threads : cfg->n_threads;
    cp.n_threads_batch = cfg->draft_threads_batch ? cfg->draft_threads_batch : cfg->n_threads_batch;
    /* -ctkd / -ctvd; a stored .dft of another type fails llama's type check
     * on restore and costs only the draft's prefill */
    cp.type_k = (enum ggml_type)cfg->draft_type_k;
    cp.type_v = (enum ggml_type)cfg->draft_type_v;
    cp.flash_attn_type = (enum llama_flash_attn_type)cfg->flash_attn;
    cp.offload_kqv = cfg->kv_offload;
    cp.kv_unified = false;
    cp.swa_full = true; /* drafts are rolled back every step: keep the whole window */
    cp.no_perf = true;
    d->ctx = llama_init_from_model(d->model, cp);
    if (!d->ctx) {
        LOG_ERR("llama.cpp could not create the draft context (-cd)");
        rc = THAW_ELLAMA;
        goto error;
    }
    if ((rc = thaw_threads_attach(d->ctx, (int)cp.n_threads, &cfg->cpu, (int)cp.n_threads_batch, &cfg->cpu_batch,
                                  &d->threads)) != 0)
        goto error;
    d->n_batch = (int)llama_n_batch(d->ctx);
    d->n_ctx_seq = (int)llama_n_ctx_seq(d->ctx);
    d->n_vocab = llama_vocab_n_tokens(d->vocab);
    d->batch = llama_batch_init(d->n_batch, 0, 1);
    d->seqs = calloc((size_t)n_slots, sizeof *d->seqs);
    d->n_seqs = n_slots;
    if (!d->batch.token || !d->seqs) {
        rc = THAW_ENOMEM;
        goto error;
    }
    char desc[128];
    llama_model_desc(d->model, desc, sizeof desc);
    LOG_INF("draft model %s: %s, %.1fM params, %d tokens per slot, drafts of %d..%d tokens (p >= %.2f)",
            cfg->draft_path, desc, (double)llama_model_n_params(d->model) / 1e6, d->n_ctx_seq, cfg->draft_min,
            cfg->draft_max, cfg->draft_p_min);
    *out = d;
    return 0;
error:
    thaw_draft_free(d);
    return rc;
}

void thaw_draft_free(struct thaw_draft *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n_seqs; i++)
        free(d->seqs[i].tokens);
    free(d->seqs);
    if (d->batch.token)
        llama_batch_free(d->batch);
    if (d->ctx)
        llama_free(d->ctx);
    thaw_threads_free(d->threads);
    if (d->model)
        llama_model_free(d->model);
    free(d);
}

int thaw_draft_n_ctx_seq(const struct thaw_draft *d) { return d->n_ctx_seq; }

void thaw_draft_clear(struct thaw_draft *d, int seq)
{
    llama_memory_seq_rm(llama_get_memory(d->ctx), seq, -1, -1);
    d->seqs[seq].n = 0;
}

static int reserve(struct dseq *q, int n)
{
    return thaw_tokens_reserve(&q->tokens, &q->cap, n);
}

/* ---- sync and propose ---------------------------------------------------------------- */

int thaw_draft_sync(struct thaw_draft *d, int seq, const llama_token *tokens, int n)
{
    struct dseq *q = &d->seqs[seq];
    int keep = thaw_lcp(q->tokens, q->n, tokens, n), done = 0;

    if (n > d->n_ctx_seq || reserve(q, n + 1) != 0) {
        thaw_draft_clear(d, seq);
        return THAW_ENOMEM;
    }
    if (!llama_memory_seq_rm(llama_get_memory(d->ctx), seq, keep, -1)) {
        thaw_draft_clear(d, seq);
        keep = 0;
    }
    q->n = keep;
    while (q->n < n) {
        d->batch.n_tokens = 0;
        for (int p = q->n; p < n && d->batch.n_tokens < d->n_batch; p++) {
            int i = d->batch.n_tokens++;
            d->batch.token[i] = tokens[p];
            d->batch.pos[i] = p;
            d->batch.n_seq_id[i] = 1;
            d->batch.seq_id[i][0] = seq;
            d->batch.logits[i] = false;
        }
        if (llama_decode(d->ctx, d->batch) != 0) {
            thaw_draft_clear(d, seq);
            return THAW_ELLAMA;
        }
        memcpy(q->tokens + q->n, tokens + q->n, (size_t)d->batch.n_tokens * sizeof(llama_token));
        q->n += d->batch.n_tokens;
        done += d->batch.n_tokens;
    }
    return done;
}

/* Greedy pick from the last logits, with its softmax probability when the
 * caller needs it (p_min > 0: one exp per vocabulary entry). */
static llama_token top_token(const float *logits, int n_vocab, float p_min, float *p)
{
    int best = 0;
    double sum = 0;

    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    *p = 1.0f;
    if (p_min > 0) {
        for (int i = 0; i < n_vocab; i++)
            sum += exp((double)(logits[i] - logits[best]));
        *p = (float)(1.0 / sum);
    }
    return best;
}

int thaw_draft_propose(struct thaw_draft *d, int seq, llama_token last, int max, float p_min, llama_token *out)
{
    struct dseq *q = &d->seqs[seq];
    llama_token cur = last;
    int n = 0;

    if (max > d->n_ctx_seq - q->n - 1)
        max = d->n_ctx_seq - q->n - 1;
    if (max <= 0 || reserve(q, q->n + max + 1) != 0)
        return 0;
    while (n < max) {
        d->batch.n_tokens = 1;
        d->batch.token[0] = cur;
        d->batch.pos[0] = q->n;
        d->batch.n_seq_id[0] = 1;
        d->batch.seq_id[0][0] = seq;
        d->batch.logits[0] = true;
        if (llama_decode(d->ctx, d->batch) != 0)
            break;
        q->tokens[q->n++] = cur;
        float p;
        llama_token t = top_token(llama_get_logits_ith(d->ctx, -1), d->n_vocab, p_min, &p);
        if (p < p_min || llama_vocab_is_eog(d->vocab, t))
            break;
        out[n++] = t;
        cur = t;
    }
    return n;
}

/* ---- .dft blob --------------------------------------------------------------------- */

int thaw_draft_capture(struct thaw_draft *d, int seq, void **out, size_t *n_out)
{
    return thaw_kvstate_capture(d->ctx, seq, d->seqs[seq].tokens, d->seqs[seq].n, out, n_out);
}

int thaw_draft_restore(struct thaw_draft *d, int seq, const void *blob, size_t n)
{
    struct thaw_kvstate_view v;
    struct dseq *q = &d->seqs[seq];
    int rc;

    if ((rc = thaw_kvstate_parse(blob, n, &v)) != 0 || (rc = reserve(q, v.n_tokens + 1)) != 0 ||
        v.n_tokens > d->n_ctx_seq || (rc = thaw_kvstate_restore(d->ctx, seq, &v)) != 0) {
        thaw_draft_clear(d, seq);
        return rc ? rc : THAW_ECORRUPT;
    }
    memcpy(q->tokens, v.tokens, (size_t)v.n_tokens * sizeof(llama_token));
    q->n = v.n_tokens;
    return q->n;
}
