/* chat.h — messages -> prompt text -> tokens, and the conversation keys.
 *
 * Keys (DESIGN §2): the lookup key hashes the conversation truncated at its
 * last assistant message; the store key hashes the conversation plus the
 * reply as the client will echo it. Both are BLAKE2b-256 over a domain tag,
 * a binding (model fingerprint + state-shaping context settings + tenant
 * namespace) and the length-prefixed (role, content) pairs, so no two
 * different conversations, models or tenants share a key short of a
 * BLAKE2b collision.
 *
 * All functions are safe to call from any thread once thaw_chat_new returned
 * (they only read the model's vocabulary and the template string).
 */
#ifndef THAW_CHAT_H
#define THAW_CHAT_H

#include "api.h"

#include <llama.h>
#include <stdbool.h>
#include <stdint.h>

#define THAW_KEY_BYTES 32

struct thaw_chat;

/* `template_override` is --chat-template (NULL = the model's own template;
 * chatml when the model has none). Returns 0 or THAW_EINVAL (the template is
 * not one llama_chat_apply_template knows; the reason is logged). */
int thaw_chat_new(const struct llama_model *model, const char *template_override, struct thaw_chat **out);
void thaw_chat_free(struct thaw_chat *chat);

/* The template in use (name or text), for the start-up log. */
const char *thaw_chat_template(const struct thaw_chat *chat);

/* Renders msgs[0..n) (plus `extra`, an assistant reply, when non-NULL) into a
 * malloc'd prompt string. `add_assistant` appends the assistant-turn opener.
 * Returns 0, THAW_EINVAL (template failure) or THAW_ENOMEM. */
int thaw_chat_render(const struct thaw_chat *chat, const struct thaw_message *msgs, size_t n,
                     const char *extra_assistant, bool add_assistant, char **out);

/* Tokenizes text (special tokens parsed, BOS added when the vocab wants it)
 * into a malloc'd array. Returns 0 or THAW_ENOMEM / THAW_EINVAL. */
int thaw_chat_tokenize(const struct thaw_chat *chat, const char *text, llama_token **out, int *n_out);

/* Request -> prompt tokens, the whole route in one call. */
int thaw_chat_prompt_tokens(const struct thaw_chat *chat, const struct thaw_chat_request *req, llama_token **out,
                            int *n_out);

/* Index of the last assistant message, or -1. */
long thaw_chat_last_assistant(const struct thaw_message *msgs, size_t n);

/* key = BLAKE2b-256("thaw.kv.v1" || binding || msgs[0..n) || [assistant: extra]).
 * `binding` is THAW_KEY_BYTES from thaw_chat_binding(). */
void thaw_chat_key(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_message *msgs, size_t n,
                   const char *extra_assistant, uint8_t out[THAW_KEY_BYTES]);

/* binding = BLAKE2b-256(fingerprint || settings string || namespace), where
 * the namespace is thaw_chat_namespace() of the request's API key (set by the
 * server, never by a client). NULL namespace: the model's identity, which is
 * no tenant's (written into every .idx). */
void thaw_chat_binding(const uint8_t fingerprint[THAW_KEY_BYTES], const char *settings,
                       const uint8_t namespace_id[THAW_KEY_BYTES], uint8_t out[THAW_KEY_BYTES]);

/* A tenant's namespace: BLAKE2b-256 keyed with a fixed domain tag over the
 * API key itself (NULL or "" = the anonymous namespace of a server without
 * keys). Stable across restarts and key reordering, gone with the key, and
 * one-way: the namespace reveals nothing of the key. */
void thaw_chat_namespace(const char *api_key, size_t len, uint8_t out[THAW_KEY_BYTES]);

#endif
