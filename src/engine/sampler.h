/* sampler.h — a request's sampler chain, from its sampling parameters and
 * the template's grammar.
 *
 * A grammar (tool calls, response_format) comes first so every later
 * sampler sees only the tokens it allows; a non-lazy one first accepts the
 * generation prompt the template already wrote. (It is asked late
 * instead where nothing needs it first: a greedy pick about its best
 * candidates, a sampled one about the token drawn; grammar_check.h.) Then
 * the stages of the server's sampling settings (sampling.h: --temp,
 * --samplers, ...) with the request's own fields (temperature, top_p, min_p, top_k, seed) over them.
 * Engine thread (libllama samplers are not shared).
 */
#ifndef THAW_SAMPLER_H
#define THAW_SAMPLER_H

#include "api/logprobs.h"
#include "base/sampling.h"
#include "engine/task.h"

#include <llama.h>

/* The chain for t (the caller frees it with llama_sampler_free). NULL when
 * the grammar does not compile or does not accept the template's own
 * generation prompt (logged), or on ENOMEM. */
struct llama_sampler *thaw_sampler_new(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                                       int n_ctx_slot, const struct thaw_task *t);

/* The logit biases t's chain applies, as llama-server lists them in
 * /completion's generation_settings: the request's logit_bias, the
 * server's --logit-bias, and with ignore_eos (the request's, else
 * --ignore-eos) every end-of-generation token at -INFINITY. Into *tok and
 * *val (the caller frees both; NULL when none). Returns how many, or
 * THAW_ENOMEM. Any thread (reads the vocabulary only). */
int thaw_sampler_biases(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                        const struct thaw_chat_request *req, llama_token **tok, float **val);

/* A sampled token's probabilities, as llama-server computes them
 * (logprobs.h): before sampling, the softmax of the logits over the whole
 * vocabulary; after (post_sampling_probs), what the chain left, and for a
 * greedy pick (which computes none) the pick alone at 1. */
struct thaw_token_probs {
    float p;                            /* the sampled token's */
    int n_top;                          /* candidates in top/top_p, most probable first */
    llama_token top[THAW_LOGPROBS_MAX];
    float top_p[THAW_LOGPROBS_MAX];
};

/* Samples row idx of the last decode with smpl (accepting the token) into
 * *tok. With `probs` non-NULL also the token's probabilities and its
 * n_probs (<= THAW_LOGPROBS_MAX) most probable candidates, after the chain
 * when `post`. Returns 0, THAW_EINVAL (a grammar at a dead end; reason in
 * err) or THAW_ENOMEM. */
int thaw_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx, int idx, int n_vocab, int n_probs,
                        bool post, struct thaw_token_probs *probs, llama_token *tok, char *err, size_t errlen);

#endif
