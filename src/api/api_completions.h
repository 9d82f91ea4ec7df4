/* api_completions.h — raw-prompt completions: OpenAI's legacy
 * POST /v1/completions and llama-server's POST /completion, two wire
 * formats with one request: thaw_codec_completions and
 * thaw_codec_completion (codec.h).
 *
 * The body becomes the same internal request as a chat (api.h) with
 * req->raw set and the prompt in raw_text or raw_tokens: every sampling
 * field is checked by the chat request's one parser, and the prompt goes
 * through the same slots, prefix reuse and block store as a conversation's.
 * Builders return malloc'd NUL-terminated JSON text (NULL on ENOMEM).
 */
#ifndef THAW_API_COMPLETIONS_H
#define THAW_API_COMPLETIONS_H

#include "api/api.h"

#include <stdbool.h>
#include <stddef.h>

/* POST /v1/completions and POST /completion bodies: "prompt" as a string,
 * an array of token ids, or a one-element array of either (one prompt per
 * request). Returns as thaw_api_parse_chat (`out` empty on error). */
int thaw_api_parse_completion(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                              char *err, size_t errlen);

/* OpenAI's text_completion object ("choices": [{"text", "index",
 * "logprobs": null, "finish_reason"}], usage, timings). */
char *thaw_api_text_completion_json(const char *id, const char *model, long created, const char *text,
                                    const char *finish_reason, int prompt_tokens, const struct thaw_timings *t);
/* One streamed text_completion chunk: `text` (may be ""), finish_reason
 * NULL = null; with `t` non-NULL the last chunk, carrying usage and timings. */
char *thaw_api_text_completion_chunk_json(const char *id, const char *model, long created, const char *text,
                                          const char *finish_reason, int prompt_tokens, const struct thaw_timings *t);

/* llama-server's /completion object: content, stop, stop_type ("eos" |
 * "limit" | "word": `stop_word`, one of the request's stop strings, ended
 * the reply; NULL = none did), stopping_word, tokens_predicted,
 * tokens_evaluated, tokens_cached, timings. With `final` false, a streamed
 * piece: {"index", "content", "tokens": [], "stop": false}. */
char *thaw_api_llama_completion_json(const char *model, const char *text, bool final, const char *finish_reason,
                                     const char *stop_word, int prompt_tokens, const struct thaw_timings *t);

/* The "content" of an assistant message (JSON text), "" when null:
 * malloc'd, NULL on ENOMEM. */
char *thaw_api_message_content(const char *message_json);

#endif
