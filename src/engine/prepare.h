/* prepare.h — a parsed request made ready for the engine: its prompt and
 * its conversation's identity (DESIGN §3: "chat template + tokenize,
 * derive lookup & store keys").
 *
 * Everything between a codec's parse (api/codec.h) and the engine's queue,
 * the same whichever API carried the request:
 *   - the server's defaults: --grammar / --json-schema for a request that
 *     constrains nothing itself, -n for max_tokens;
 *   - the cheap bounds first (admission, id_slot), so a request that
 *     cannot fit costs no template or tokenizer work;
 *   - logit_bias words turned into tokens;
 *   - the prompt: the model's template (tools, reasoning, grammar, stops,
 *     the reply's parser) or a raw completion's text or tokens;
 *   - the conversation's identity for the cache tiers: the branch point
 *     new conversations share, the generation prompt a hybrid checkpoints
 *     before, the binding (model, context settings, tenant, tools,
 *     template kwargs), the lookup key now and the store key once the
 *     reply is known (DESIGN §2 "Keying").
 * The transport never sees these: it parses, prepares, submits, replies.
 *
 * Any thread: it reads only what the engine fixed at start-up.
 */
#ifndef THAW_PREPARE_H
#define THAW_PREPARE_H

#include "engine/engine.h"
#include "engine/task.h"

#include <stddef.h>
#include <stdint.h>

/* Prepares `req` for tenant `ns` (THAW_KEY_BYTES, thaw_keys_namespace).
 * `req` is taken: moved into the task, or freed on failure.
 * `conversation_id` is the client's own id of the conversation, only
 * logged (NULL: none). Returns 0 and *out, a task with one reference, not
 * submitted, no client yet; THAW_EINVAL: the request cannot be served (the
 * reason in err[errlen], for a 400); or another code (THAW_ENOMEM,
 * thaw_strerror's text, for a 500). */
int thaw_prepare_task(struct thaw_engine *e, struct thaw_chat_request *req, const uint8_t ns[THAW_KEY_BYTES],
                      const char *conversation_id, struct thaw_task **out, char *err, size_t errlen);

/* The prompt `req` renders to, counted into *n_prompt (the count_tokens
 * routes): the same checks and rendering as thaw_prepare_task, nothing
 * kept. `req` is taken. Same returns. */
int thaw_prepare_count(struct thaw_engine *e, struct thaw_chat_request *req, int *n_prompt, char *err,
                       size_t errlen);

/* The store key of t's finished reply (engine thread, at the reply's
 * end): the conversation's history followed by `norm_reply`, the reply
 * as the client will echo it back (thaw_chat_parse_reply's normalised
 * message), over the task's binding; a raw completion's is its tokens
 * (`tokens`, n_tokens: the slot's). */
void thaw_prepare_store_key(const struct thaw_task *t, const char *norm_reply, const llama_token *tokens,
                            int n_tokens, uint8_t out[THAW_KEY_BYTES]);

#endif
