/* request_keys.h — the keys of a request's conversation: what the cache
 * tiers look a request up by and store its reply under (DESIGN §2
 * "Keying"). They hash the messages as api.c normalised them, over a
 * binding from keys.h; the tiers below only ever see the 32 bytes.
 * Pure functions: any thread (after sodium_init()).
 */
#ifndef THAW_REQUEST_KEYS_H
#define THAW_REQUEST_KEYS_H

#include "cache/keys.h"

#include <stddef.h>
#include <stdint.h>

struct thaw_message;      /* api.h */
struct thaw_chat_request; /* api.h */

/* Index of the last assistant message, or -1 (no lookup key then). */
long thaw_request_keys_last_assistant(const struct thaw_message *msgs, size_t n);

/* key = BLAKE2b-256("thaw.kv.v2" || binding || msgs[i].json ... ||
 * [extra_json]). `binding` is from thaw_keys_binding (+
 * thaw_request_keys_bind); `extra_json` is a normalised assistant message or
 * NULL. */
void thaw_request_keys_conversation(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_message *msgs, size_t n,
                                    const char *extra_json, uint8_t out[THAW_KEY_BYTES]);

/* The store key of a finished reply: thaw_request_keys_conversation over the
 * request's messages and `reply_json`; for a raw completion (req->raw: no
 * messages to name it) BLAKE2b-256("thaw.kv.raw.v1" || binding || the
 * slot's `tokens` as little-endian int32), so two prompts never share one. */
void thaw_request_keys_reply(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                             const char *reply_json, const int32_t *tokens, int n_tokens, uint8_t out[THAW_KEY_BYTES]);

/* Mixes what else shapes the rendered prompt into a binding: the request's
 * tools and chat_template_kwargs. Two agents with the same messages but
 * other tools never share a key. `out` may alias `binding`. */
void thaw_request_keys_bind(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                            uint8_t out[THAW_KEY_BYTES]);

#endif
