/* sampler.h — a request's sampler chain, from its sampling parameters and
 * the template's grammar.
 *
 * A grammar (tool calls, response_format) comes first so every later
 * sampler sees only the tokens it allows; a non-lazy one first accepts the
 * generation prompt the template already wrote. Then the stages of the
 * server's sampling settings (sampling.h: --temp, --samplers, ...) with the
 * request's own fields (temperature, top_p, min_p, top_k, seed) over them.
 * Engine thread (libllama samplers are not shared).
 */
#ifndef THAW_SAMPLER_H
#define THAW_SAMPLER_H

#include "base/sampling.h"
#include "engine/task.h"

#include <llama.h>

/* The chain for t (the caller frees it with llama_sampler_free). NULL when
 * the grammar does not compile or does not accept the template's own
 * generation prompt (logged), or on ENOMEM. */
struct llama_sampler *thaw_sampler_new(const struct llama_vocab *vocab, const struct thaw_sampling *defaults,
                                       int n_ctx_slot, const struct thaw_task *t);

#endif
