/* api_wire.h — what the codecs (codec.h: api.c, api_anthropic.c,
 * api_responses.c, api_completions.c) share: the request's one parser, and
 * the helpers their writers and replies are built from (codec.c).
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

/* A request body that must be a JSON object (duplicate keys refused): the
 * object (the caller's reference), or NULL with the reason in err. */
json_t *thaw_api_load_object(const char *body, size_t len, char *err, size_t errlen);

/* An optional boolean field of root: absent or null leaves *out as it
 * is; else 0, or THAW_EINVAL (not a boolean, reason in err). */
int thaw_api_get_bool(json_t *root, const char *name, bool *out, char *err, size_t errlen);

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
/* A converter's retention hints (struct thaw_api_retain), handed through
 * the chat object it builds under this key: [[n_msgs, ttl_s], ...]. Only a
 * converter sets it; a chat completion's own body never reaches it. */
#define THAW_API_RETAIN_KEY "thaw.retain"

int thaw_api_parse_via_chat(const char *body, size_t len, bool default_cache_prompt, thaw_api_convert_fn convert,
                            struct thaw_chat_request *out, char *err, size_t errlen);

/* json_dumps(root) compact, then root's reference dropped; NULL if root is
 * NULL or on ENOMEM. The caller frees the string. */
char *thaw_api_dump(json_t *root);
/* llama-server's `timings` object, numbers only (as llama-server's: a
 * client may decode it as a map of numbers), with thaw's restore_ms and
 * draft counts; OpenAI's `usage` with cached_tokens. New references. */
json_t *thaw_api_timings_json(const struct thaw_timings *t);
/* Sets "timings" (above) on the object `o` and, beside it, thaw's
 * "cache_source" (what served the cached tokens: "slot", "ram", "disk",
 * "blocks", "shared" or "none"). 0, or THAW_ENOMEM. */
int thaw_api_set_timings(json_t *o, const struct thaw_timings *t);
json_t *thaw_api_usage_json(int prompt_tokens, const struct thaw_timings *t);

/* ---- what the codecs' writers and replies share (codec.c) ---- */

struct thaw_codec_stream;
struct thaw_reply;

/* The 401's hint of every API that takes OpenAI's Bearer key */
#define THAW_API_AUTH_HINT "missing or invalid API key: send 'Authorization: Bearer <key>'"

/* OpenAI's shape of an error (thaw_api_error_json) and llama-server's 400
 * of a prompt longer than a slot's context: type
 * "exceed_context_size_error" with n_prompt_tokens and n_ctx (a slot's),
 * so a client can trim by the numbers. */
char *thaw_api_too_long_json(int n_prompt, int n_ctx_slot);

/* One event of a stream, handed to the transport's framing: `json`
 * (malloc'd text, taken; NULL means ENOMEM upstream), or `v` (taken).
 * `event` NULL: a data line only. 0 or THAW_ENOMEM. */
int thaw_codec_emit_text(struct thaw_codec_stream *st, const char *event, char *json);
int thaw_codec_emit(struct thaw_codec_stream *st, const char *event, json_t *v);
/* llama-server's prompt_progress {total, cache, processed, time_ms} added
 * to `chunk` (taken), which is then emitted (as `event`, or NULL: a data
 * line only). 0 or THAW_ENOMEM. */
int thaw_codec_emit_progress(struct thaw_codec_stream *st, const char *event, json_t *chunk, int processed,
                             int64_t time_us, int cache_n);
/* json_loads of `text` (taken); NULL when text is NULL or not JSON. */
json_t *thaw_codec_loads(char *text);

/* The probability entries that go with the text handed out so far and
 * are not yet sent (marked sent): llama-server's array, or with `legacy`
 * OpenAI completions' object. NULL on ENOMEM. */
json_t *thaw_codec_lp_take(struct thaw_codec_stream *st, bool legacy);
/* Sets choices[0].logprobs of `chunk` (JSON text, taken) to those
 * entries: {"content": [...]} (chat) or the legacy object; the chunk as it
 * was when the request wants none. NULL on ENOMEM. */
char *thaw_codec_lp_attach(struct thaw_codec_stream *st, char *chunk, bool legacy);
/* llama-server's timings_per_token: "timings" (the timings as of the text
 * handed out so far) set on `chunk` (JSON text, taken); the chunk as it
 * was when the request did not ask. NULL on ENOMEM. */
char *thaw_codec_timings_attach(const struct thaw_codec_stream *st, char *chunk);
/* Those timings set on `o` as thaw_api_set_timings does, when the request
 * asked; `o` as it was when it did not. */
void thaw_codec_live_timings(const struct thaw_codec_stream *st, json_t *o);
/* A whole reply's entries (its n_text bytes, done; `legacy`: OpenAI
 * completions' object) put into the reply object `body` (taken) by
 * `place` (which takes no reference to lp). NULL on ENOMEM. */
char *thaw_codec_add_logprobs(const struct thaw_reply *r, char *body, bool legacy, void (*place)(json_t *root,
                                                                                                  json_t *lp));

/* The open part's text: `s` (a JSON string) appended; 0 or THAW_ENOMEM.
 * Reset: its text, call id and name freed. */
int thaw_codec_part_add(struct thaw_codec_stream *st, json_t *s);
void thaw_codec_part_reset(struct thaw_codec_stream *st);

/* llama-server's __verbose added to a reply object's JSON `body` (taken):
 * the prompt as read (r->prompt), the reply's text and its counts. The
 * body as it was when anything fails. */
char *thaw_codec_add_verbose(const struct thaw_reply *r, char *body);
/* What a whole reply's `body` (taken; NULL passes through) gains when
 * the request asked for it: __verbose (thaw_codec_add_verbose), then its
 * logprobs (thaw_codec_add_logprobs, `legacy` and `place` as there). */
char *thaw_codec_add_extras(const struct thaw_reply *r, char *body, bool legacy,
                            void (*place)(json_t *root, json_t *lp));
/* thaw_codec.merge_choice of the OpenAI APIs: choice 0 of `other` appended
 * to body's choices as choice `index`, its completion tokens added to the
 * usage. Both taken; NULL on ENOMEM. */
char *thaw_codec_merge_choice(char *body, char *other, int index);

#endif
