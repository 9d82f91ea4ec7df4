/* api_responses.h — the OpenAI Responses API (POST /v1/responses) <->
 * thaw's internal request (api.h). Its table is thaw_codec_responses
 * (codec.h): this parser, the response object, its stream's events.
 *
 * A Responses request becomes the same struct thaw_chat_request a chat
 * completion does (DESIGN §13):
 *   instructions, system / developer messages -> system messages
 *   message items (input_text / output_text parts, or a string) -> messages
 *   reasoning items        -> the next assistant message's reasoning_content
 *   function_call items    -> that assistant message's tool_calls
 *   function_call_output   -> tool messages (tool_call_id = call_id)
 *   function tools, and the functions inside namespace tools -> function tools
 *   tool_choice, parallel_tool_calls, text.format (json_schema, json_object),
 *   max_output_tokens, temperature, top_p, stream, prompt_cache_key,
 *   reasoning.effort -> reasoning_effort (the template's; "none": thinking off)
 * Consecutive reasoning, assistant message and function_call items (the
 * order thaw answers them in) merge into one assistant message, so a reply
 * echoed back is keyed and rendered as the one thaw stored. Other tool
 * types (web_search, ...) are left out with a log line; images are a 400;
 * store: true and previous_response_id are a 400 (thaw keeps no responses:
 * the client sends the whole input every turn).
 *
 * Builders return malloc'd JSON text the caller frees (NULL on ENOMEM).
 */
#ifndef THAW_API_RESPONSES_H
#define THAW_API_RESPONSES_H

#include "api/api.h"

#include <stdbool.h>
#include <stddef.h>

/* Parses a Responses request body into `out` (free with
 * thaw_chat_request_free). Returns 0, THAW_ENOMEM, or THAW_EINVAL with the
 * offending field named in err[errlen]. */
int thaw_responses_parse(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                         char *err, size_t errlen);

/* The "response" object. `message_json` NULL: the response in progress
 * (no output, no usage yet). Otherwise the reply (content,
 * reasoning_content, tool_calls) as output items in that order, whose ids
 * are derived from `id` and the item's index, so a stream's items and the
 * final object name the same items. */
char *thaw_responses_json(const char *id, const char *model, long created, const char *message_json,
                          const char *finish_reason, int n_prompt, const struct thaw_timings *t);

/* The id of output item `index` of response `id`, of kind "msg", "rs" or
 * "fc", into out[48]. */
void thaw_responses_item_id(const char *id, const char *kind, int index, char out[64]);

#endif
