/* sampler.c — a request's sampler chain (sampler.h).
 *
 * The settings' stages are built the way llama-server builds them
 * (common/sampling.cpp): the stages in --samplers order, then the sampler
 * that picks: dist, or adaptive-p when it is listed; Mirostat replaces the
 * stages with temperature + Mirostat. thaw keeps one rule of its own:
 * temp <= 0 is greedy (argmax), whatever the stages, so a greedy request is
 * exact. */
#include "engine/sampler.h"

#include "api/template.h"
#include "base/error.h"
#include "base/log.h"
#include "base/sampling.h"
#include "engine/budget.h"
#include "engine/grammar_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(THAW_SAMPLING_SEED_RANDOM == LLAMA_DEFAULT_SEED, "a random seed means the same to libllama");

static int add(struct llama_sampler *chain, struct llama_sampler *s)
{
    if (!s)
        return THAW_ENOMEM;
    llama_sampler_chain_add(chain, s);
    return 0;
}

/* --logit-bias, the model's suppressed tokens and, with --ignore-eos, every
 * end-of-generation token at -inf: one logit-bias sampler, as llama-server
 * merges them (ids outside the vocabulary are skipped) */
static int add_biases(const struct thaw_sampling *s, struct llama_sampler *chain, const struct llama_vocab *vocab)
{
    int32_t n_vocab = llama_vocab_n_tokens(vocab), n_supp = 0, n = 0, cap;
    const llama_token *supp = llama_vocab_get_suppress_tokens(vocab, &n_supp);
    llama_logit_bias *bias;
    int rc;

    cap = s->n_logit_bias + n_supp;
    if (s->ignore_eos)
        for (llama_token t = 0; t < n_vocab; t++)
            cap += llama_vocab_is_eog(vocab, t);
    if (cap == 0)
        return 0;
    if (!(bias = malloc((size_t)cap * sizeof *bias)))
        return THAW_ENOMEM;
    for (int i = 0; i < s->n_logit_bias; i++)
        if (s->logit_bias[i].token < n_vocab)
            bias[n++] = (llama_logit_bias){s->logit_bias[i].token, s->logit_bias[i].bias};
    for (int32_t i = 0; i < n_supp; i++)
        bias[n++] = (llama_logit_bias){supp[i], -INFINITY};
    if (s->ignore_eos)
        for (llama_token t = 0; t < n_vocab; t++)
            if (llama_vocab_is_eog(vocab, t))
                bias[n++] = (llama_logit_bias){t, -INFINITY};
    rc = n ? add(chain, llama_sampler_init_logit_bias(n_vocab, n, bias)) : 0; /* it copies the biases */
    free(bias);
    return rc;
}

static int build_stages(const struct thaw_sampling *s, const struct llama_vocab *vocab, int n_ctx_slot,
                        struct llama_sampler *chain)
{
    int32_t n_vocab = llama_vocab_n_tokens(vocab);
    int last_n = s->penalty_last_n < 0 ? n_ctx_slot : s->penalty_last_n;
    int dry_last_n = s->dry_penalty_last_n < 0 ? n_ctx_slot : s->dry_penalty_last_n;
    bool adaptive = false;
    int rc = 0;

    if ((rc = add_biases(s, chain, vocab)) != 0)
        return rc;
    if (s->temp <= 0.0f)
        return add(chain, llama_sampler_init_greedy());
    if (s->mirostat == 1 || s->mirostat == 2) {
        if ((rc = add(chain, llama_sampler_init_temp(s->temp))) != 0)
            return rc;
        return add(chain, s->mirostat == 1 ? llama_sampler_init_mirostat(n_vocab, s->seed, s->mirostat_tau,
                                                                         s->mirostat_eta, 100)
                                           : llama_sampler_init_mirostat_v2(s->seed, s->mirostat_tau, s->mirostat_eta));
    }
    for (int i = 0; i < s->n_stages && rc == 0; i++) {
        switch ((enum thaw_sampler_stage)s->stages[i]) {
        case THAW_STAGE_PENALTIES:
            rc = add(chain, llama_sampler_init_penalties(n_vocab, last_n, s->penalty_repeat, s->penalty_freq,
                                                         s->penalty_present));
            break;
        case THAW_STAGE_DRY: {
            const char *br[THAW_SAMPLING_BREAKERS_BYTES / 2];
            size_t off = 0;
            for (int j = 0; j < s->n_dry_breakers; j++) {
                br[j] = s->dry_breakers + off;
                off += strlen(br[j]) + 1;
            }
            rc = add(chain, llama_sampler_init_dry(vocab, s->dry_multiplier, s->dry_base, s->dry_allowed_length,
                                                   dry_last_n, br, (size_t)s->n_dry_breakers));
            break;
        }
        case THAW_STAGE_TOP_N_SIGMA:
            rc = add(chain, llama_sampler_init_top_n_sigma(s->top_n_sigma));
            break;
        case THAW_STAGE_TOP_K:
            rc = add(chain, llama_sampler_init_top_k(s->top_k));
            break;
        case THAW_STAGE_TYPICAL_P:
            rc = add(chain, llama_sampler_init_typical(s->typ_p, 0));
            break;
        case THAW_STAGE_TOP_P:
            rc = add(chain, llama_sampler_init_top_p(s->top_p, 0));
            break;
        case THAW_STAGE_MIN_P:
            rc = add(chain, llama_sampler_init_min_p(s->min_p, 0));
            break;
        case THAW_STAGE_XTC:
            rc = add(chain, llama_sampler_init_xtc(s->xtc_probability, s->xtc_threshold, 0, s->seed));
            break;
        case THAW_STAGE_TEMPERATURE:
            rc = add(chain, llama_sampler_init_temp_ext(s->temp, s->dynatemp_range, s->dynatemp_exponent));
            break;
        case THAW_STAGE_ADAPTIVE_P:
            adaptive = true; /* picks the token: goes last, in dist's place */
            break;
        }
    }
    if (rc != 0)
        return rc;
    return add(chain, adaptive ? llama_sampler_init_adaptive_p(s->adaptive_target, s->adaptive_decay, s->seed)
                               : llama_sampler_init_dist(s->seed));
}

/* The settings' stages appended to `chain` (a llama_sampler_chain) as one sampler,
 * ending with the one that picks the token: greedy when temp <= 0, else
 * dist (or Mirostat / adaptive-p). `n_ctx_slot` resolves the -1
 * look-backs. The `n_history` tokens of `history` (the prompt) are accepted
 * first, so the penalties and DRY see them as llama-server's do; a grammar
 * already in `chain` does not. Returns 0, or THAW_ENOMEM (`chain` is then
 * unchanged; the caller frees it either way). */
int thaw_sampling_build(const struct thaw_sampling *s, const struct llama_vocab *vocab, int n_ctx_slot,
                        const int32_t *history, int n_history, struct llama_sampler *chain);

static int build_settings(const struct thaw_sampling *s, const struct llama_vocab *vocab, int n_ctx_slot,
                          const int32_t *history, int n_history, struct llama_sampler *chain)
{
    /* its own chain, so the history reaches these samplers and not a
     * grammar ahead of them in `chain` */
    struct llama_sampler *sub = llama_sampler_chain_init(llama_sampler_chain_default_params());
    int rc;

    if (!sub)
        return THAW_ENOMEM;
    if ((rc = build_stages(s, vocab, n_ctx_slot, sub)) != 0) {
        llama_sampler_free(sub);
        return rc;
    }
    for (int i = 0; i < n_history; i++)
        llama_sampler_accept(sub, history[i]);
    llama_sampler_chain_add(chain, sub);
    return 0;
}

/* The server's defaults (--temp, --top-k, --samplers, ...) with the
 * request's own fields over them. */
static struct thaw_sampling request_settings(const struct thaw_sampling *defaults, const struct thaw_chat_request *req)
{
    struct thaw_sampling sp = *defaults;
    if (!isnan(req->temperature))
        sp.temp = req->temperature;
    if (!isnan(req->top_p))
        sp.top_p = req->top_p;
    if (!isnan(req->min_p))
        sp.min_p = req->min_p;
    if (req->top_k >= 0)
        sp.top_k = req->top_k;
    if (req->has_seed)
        sp.seed = req->seed;
    const double *f = req->smp;
#define OVER(i, field)                                                                                                 \
    if (!isnan(f[i]))                                                                                                  \
    sp.field = (__typeof__(sp.field))f[i]
    OVER(THAW_API_SMP_REPEAT_PENALTY, penalty_repeat);
    OVER(THAW_API_SMP_REPEAT_LAST_N, penalty_last_n);
    OVER(THAW_API_SMP_PRESENCE_PENALTY, penalty_present);
    OVER(THAW_API_SMP_FREQUENCY_PENALTY, penalty_freq);
    OVER(THAW_API_SMP_TYPICAL_P, typ_p);
    OVER(THAW_API_SMP_TOP_N_SIGMA, top_n_sigma);
    OVER(THAW_API_SMP_XTC_PROBABILITY, xtc_probability);
    OVER(THAW_API_SMP_XTC_THRESHOLD, xtc_threshold);
    OVER(THAW_API_SMP_DRY_MULTIPLIER, dry_multiplier);
    OVER(THAW_API_SMP_DRY_BASE, dry_base);
    OVER(THAW_API_SMP_DRY_ALLOWED_LENGTH, dry_allowed_length);
    OVER(THAW_API_SMP_DRY_PENALTY_LAST_N, dry_penalty_last_n);
    OVER(THAW_API_SMP_DYNATEMP_RANGE, dynatemp_range);
    OVER(THAW_API_SMP_DYNATEMP_EXPONENT, dynatemp_exponent);
    OVER(THAW_API_SMP_MIROSTAT, mirostat);
    OVER(THAW_API_SMP_MIROSTAT_TAU, mirostat_tau);
    OVER(THAW_API_SMP_MIROSTAT_ETA, mirostat_eta);
#undef OVER
    if (req->ignore_eos >= 0)
        sp.ignore_eos = req->ignore_eos;
    return sp;
}

/* The request's grammar, compiled, with the template's generation prompt
 * accepted. NULL (logged when it is the prompt) on failure. */
static struct llama_sampler *new_grammar(const struct llama_vocab *vocab, const struct thaw_chat_gen *g)
{
    struct llama_sampler *gr =
        g->grammar_lazy ? llama_sampler_init_grammar_lazy_patterns(vocab, g->grammar, "root", (const char **)g->triggers,
                                                                  (size_t)g->n_triggers, g->trigger_tokens,
                                                                  (size_t)g->n_trigger_tokens)
                        : llama_sampler_init_grammar(vocab, g->grammar, "root");
    char err[256];

    if (!gr)
        return NULL;
    for (int i = 0; i < g->n_prefill; i++)
        if (thaw_tmpl_sampler_accept(gr, g->prefill[i], err, sizeof err) != 0) {
            LOG_WRN("the template's grammar does not accept its own generation prompt (%s)", err);
            llama_sampler_free(gr);
            return NULL;
        }
    return gr;
}

struct llama_sampler *thaw_sampler_new(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                                       int n_ctx_slot, const struct thaw_task *t)
{
    const struct thaw_chat_request *req = &t->req;
    const struct thaw_chat_gen *g = &t->gen;
    const struct thaw_sampling sp = request_settings(defaults, req);
    const bool budget = g->think_start && g->reasoning_budget >= 0;
    /* the grammar asked late (grammar_check.h): a greedy pick asks it about
     * the best candidates first, a sampled one about the token drawn; not
     * when a stage must see what the grammar forbids (the budget) or the
     * probabilities after it are reported */
    const bool late = g->grammar && !budget && !(req->n_probs > 0 && req->post_sampling_probs);
    const bool greedy_grammar = late && sp.temp <= 0.0f;
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    struct llama_sampler *gr = NULL;

    if (!c)
        return NULL;
    if (g->grammar) {
        if (!(gr = new_grammar(vocab, g))) {
            llama_sampler_free(c);
            return NULL;
        }
        if (!late)
            llama_sampler_chain_add(c, gr);
    }
    if (req->n_bias_tok > 0) { /* the request's logit_bias (api.h), beside the server's --logit-bias */
        llama_logit_bias *lb = malloc((size_t)req->n_bias_tok * sizeof *lb);
        if (!lb)
            goto fail;
        for (int i = 0; i < req->n_bias_tok; i++)
            lb[i] = (llama_logit_bias){req->bias_tok[i], req->bias_val[i]};
        llama_sampler_chain_add(c, llama_sampler_init_logit_bias(llama_vocab_n_tokens(vocab), req->n_bias_tok, lb));
        free(lb); /* it copies them */
    }
    if (greedy_grammar) {
        /* the settings' stages of a greedy pick (build_stages): the
         * biases, then the grammar, then the pick */
        struct llama_sampler *gg = thaw_grammar_greedy_new(gr);
        gr = NULL; /* the stage owns it, also when it could not be made */
        if (!gg)
            goto fail;
        if (add_biases(&sp, c, vocab) != 0) {
            llama_sampler_free(gg);
            goto fail;
        }
        llama_sampler_chain_add(c, gg);
        if (add(c, llama_sampler_init_greedy()) != 0)
            goto fail;
        return c;
    }
    /* the reasoning budget (budget.h): after the grammar and the biases,
     * so it sees what they forbid and never forces against them; before
     * the settings' stages, so the pick is the forced token */
    if (budget) {
        struct thaw_budget_params bp = {g->think_start, (const char *const *)g->think_ends, g->n_think_ends,
                                        g->think_forced, g->n_think_forced, g->reasoning_budget};
        struct llama_sampler *b = thaw_budget_new(vocab, &bp);
        if (!b)
            goto fail;
        thaw_budget_feed(b, g->gen_prompt);
        llama_sampler_chain_add(c, b);
    }
    if (build_settings(&sp, vocab, n_ctx_slot, t->prompt, t->n_prompt, c) != 0)
        goto fail;
    if (late) { /* a sampled pick: the chain so far draws, the grammar checks */
        struct llama_sampler *top = llama_sampler_chain_init(llama_sampler_chain_default_params());
        struct llama_sampler *check = thaw_grammar_check_new(gr, c); /* owns both now */
        if (!top || !check) {
            llama_sampler_free(top);
            llama_sampler_free(check);
            return NULL;
        }
        llama_sampler_chain_add(top, check); /* in a chain: libllama reuses its candidate buffer */
        return top;
    }
    return c;
fail:
    if (late)
        llama_sampler_free(gr); /* not in the chain yet (NULL once a stage owns it) */
    llama_sampler_free(c);      /* with gr, when it is in the chain */
    return NULL;
}

int thaw_sampler_biases(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                        const struct thaw_chat_request *req, llama_token **tok, float **val)
{
    int32_t n_vocab = llama_vocab_n_tokens(vocab);
    bool ignore_eos = req->ignore_eos >= 0 ? req->ignore_eos > 0 : defaults->ignore_eos;
    int cap = req->n_bias_tok + defaults->n_logit_bias, n = 0;

    *tok = NULL;
    *val = NULL;
    if (ignore_eos)
        for (llama_token t = 0; t < n_vocab; t++)
            cap += llama_vocab_is_eog(vocab, t);
    if (cap == 0)
        return 0;
    llama_token *tk = malloc((size_t)cap * sizeof *tk);
    float *v = malloc((size_t)cap * sizeof *v);
    if (!tk || !v) {
        free(tk);
        free(v);
        return THAW_ENOMEM;
    }
    for (int i = 0; i < req->n_bias_tok; i++)
        tk[n] = req->bias_tok[i], v[n++] = req->bias_val[i];
    for (int i = 0; i < defaults->n_logit_bias; i++)
        if (defaults->logit_bias[i].token < n_vocab)
            tk[n] = defaults->logit_bias[i].token, v[n++] = defaults->logit_bias[i].bias;
    if (ignore_eos)
        for (llama_token t = 0; t < n_vocab; t++)
            if (llama_vocab_is_eog(vocab, t))
                tk[n] = t, v[n++] = -INFINITY;
    *tok = tk;
    *val = v;
    return n;
}


/* ---- probabilities ---------------------------------------------------------------- */

/* Keeps the n_max largest values seen in top/top_v (most first), *n of them. */
static void keep_top(llama_token *top, float *top_v, int *n, int n_max, llama_token id, float v)
{
    int i = *n < n_max ? (*n)++ : n_max;

    if (n_max == 0 || (i == n_max && v <= top_v[n_max - 1]))
        return;
    if (i == n_max)
        i = n_max - 1;
    while (i > 0 && top_v[i - 1] < v) {
        top[i] = top[i - 1];
        top_v[i] = top_v[i - 1];
        i--;
    }
    top[i] = id;
    top_v[i] = v;
}

/* Before sampling: the softmax of row idx's logits over the vocabulary. */
static void probs_pre(const float *logits, int n_vocab, int n_probs, llama_token tok, struct thaw_token_probs *out)
{
    float max = -INFINITY;
    double sum = 0;

    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > max)
            max = logits[i];
    out->n_top = 0;
    for (int i = 0; i < n_vocab; i++) {
        sum += exp((double)logits[i] - max);
        keep_top(out->top, out->top_p, &out->n_top, n_probs, i, logits[i]);
    }
    for (int i = 0; i < out->n_top; i++)
        out->top_p[i] = (float)(exp((double)out->top_p[i] - max) / sum);
    out->p = (float)(exp((double)logits[tok] - max) / sum);
}

/* After the chain: its candidates by probability, none at 0. */
static void probs_post(const llama_token_data_array *cur, int n_probs, struct thaw_token_probs *out)
{
    const llama_token_data *sel = &cur->data[cur->selected];

    out->n_top = 0;
    if (sel->p <= 0.0f) { /* greedy computes no probabilities: the pick is certain */
        out->p = 1.0f;
        if (n_probs > 0) {
            out->top[0] = sel->id;
            out->top_p[0] = 1.0f;
            out->n_top = 1;
        }
        return;
    }
    out->p = sel->p;
    for (size_t i = 0; i < cur->size; i++)
        if (cur->data[i].p > 0.0f)
            keep_top(out->top, out->top_p, &out->n_top, n_probs, cur->data[i].id, cur->data[i].p);
}

int thaw_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx, int idx, int n_vocab, int n_probs,
                        bool post, struct thaw_token_probs *probs, llama_token *tok, char *err, size_t errlen)
{
    if (n_probs > THAW_LOGPROBS_MAX)
        n_probs = THAW_LOGPROBS_MAX;
    if (!probs)
        return thaw_tmpl_sampler_sample(smpl, ctx, idx, tok, err, errlen);
    if (!post) {
        int rc = thaw_tmpl_sampler_sample(smpl, ctx, idx, tok, err, errlen);
        if (rc == 0)
            probs_pre(llama_get_logits_ith(ctx, idx), n_vocab, n_probs, *tok, probs);
        return rc;
    }
    llama_token_data *buf = malloc((size_t)n_vocab * sizeof *buf);
    llama_token_data_array cur;
    int rc;

    if (!buf)
        return THAW_ENOMEM;
    rc = thaw_tmpl_sampler_sample_cur(smpl, ctx, idx, buf, n_vocab, &cur, err, errlen);
    if (rc == 0) {
        *tok = cur.data[cur.selected].id;
        probs_post(&cur, n_probs, probs);
    }
    free(buf);
    return rc;
}
