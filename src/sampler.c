/* sampler.c — a request's sampler chain (sampler.h). */
#include "sampler.h"

#include "log.h"
#include "sampling.h"
#include "template.h"

#include <math.h>

struct llama_sampler *thaw_sampler_new(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                                       int n_ctx_slot, const struct thaw_task *t)
{
    const struct thaw_chat_request *req = &t->req;
    const struct thaw_chat_gen *g = &t->gen;
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());

    if (!c)
        return NULL;
    if (g->grammar) {
        struct llama_sampler *gr =
            g->grammar_lazy ? llama_sampler_init_grammar_lazy_patterns(vocab, g->grammar, "root",
                                                                      (const char **)g->triggers, (size_t)g->n_triggers,
                                                                      g->trigger_tokens, (size_t)g->n_trigger_tokens)
                            : llama_sampler_init_grammar(vocab, g->grammar, "root");
        if (!gr) {
            llama_sampler_free(c);
            return NULL;
        }
        char err[256];
        for (int i = 0; i < g->n_prefill; i++)
            if (thaw_tmpl_sampler_accept(gr, g->prefill[i], err, sizeof err) != 0) {
                LOG_WRN("the template's grammar does not accept its own generation prompt (%s)", err);
                llama_sampler_free(gr);
                llama_sampler_free(c);
                return NULL;
            }
        llama_sampler_chain_add(c, gr);
    }
    /* the server's defaults (--temp, --top-k, --samplers, ...), the request's own fields over them */
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
    if (thaw_sampling_build(&sp, vocab, n_ctx_slot, t->prompt, t->n_prompt, c) != 0) {
        llama_sampler_free(c);
        return NULL;
    }
    return c;
}

