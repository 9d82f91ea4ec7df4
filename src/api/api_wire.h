/* api_wire.h — what the Anthropic (api_anthropic.c), Responses
 * (api_responses.c) and completions (api_completions.c) codecs share with
 * the chat-completions one (api.c).
 *
 * Each translates its request into a chat-completions object (jansson, never
 * text again) and reads that with thaw_api_parse_chat_json: one internal
 * request, so every field is checked by one parser and reaches the
 * templates, keys and tiers the same way. Private to the API layer (it
 * speaks jansson).
 */
#ifndef THAW_API_WIRE_H
#define THAW_API_WIRE_H

#include "api/api.h"

#include <jansson.h>

/* Writes the reason to err[errlen]; returns THAW_EINVAL. */
int thaw_api_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Fills the chat-completions object `oai` from a request's `root`
 * (validated, a JSON object). 0, THAW_EINVAL (reason in err) or
 * THAW_ENOMEM. */
typedef int (*thaw_api_convert_fn)(json_t *root, json_t *oai, char *err, size_t errlen);

/* thaw_api_parse_chat on a body already parsed: `root` (borrowed) is read
 * as a chat-completions request. Same returns; `out` empty on error. */
int thaw_api_parse_chat_json(json_t *root, bool default_cache_prompt, struct thaw_chat_request *out, char *err,
                             size_t errlen);

/* Parses body as JSON, converts it with `convert` into a chat-completions
 * object, then reads that as thaw_api_parse_chat_json does (same returns;
 * `out` empty on error). The body is parsed once: no text in between. */
int thaw_api_parse_via_chat(const char *body, size_t len, bool default_cache_prompt, thaw_api_convert_fn convert,
                            struct thaw_chat_request *out, char *err, size_t errlen);

/* json_dumps(root) compact, then root's reference dropped; NULL if root is
 * NULL or on ENOMEM. The caller frees the string. */
char *thaw_api_dump(json_t *root);
/* llama-server's `timings` object with thaw's cache_source, restore_ms and
 * draft counts; OpenAI's `usage` with cached_tokens. New references. */
json_t *thaw_api_timings_json(const struct thaw_timings *t);
json_t *thaw_api_usage_json(int prompt_tokens, const struct thaw_timings *t);

#endif
