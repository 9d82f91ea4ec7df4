/* sampler.c — a request's sampler chain (sampler.h). */
#include "sampler.h"

#include "log.h"
#include "template.h"

struct llama_sampler *thaw_sampler_new(const struct llama_vocab *vocab, const struct thaw_task *t)
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
    if (req->temperature <= 0.0f) {
        llama_sampler_chain_add(c, llama_sampler_init_greedy());
        return c;
    }
    if (req->top_k > 0)
        llama_sampler_chain_add(c, llama_sampler_init_top_k(req->top_k));
    if (req->top_p < 1.0f)
        llama_sampler_chain_add(c, llama_sampler_init_top_p(req->top_p, 1));
    if (req->min_p > 0.0f)
        llama_sampler_chain_add(c, llama_sampler_init_min_p(req->min_p, 1));
    llama_sampler_chain_add(c, llama_sampler_init_temp(req->temperature));
    llama_sampler_chain_add(c, llama_sampler_init_dist(req->has_seed ? req->seed : LLAMA_DEFAULT_SEED));
    return c;
}

