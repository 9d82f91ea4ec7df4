/* api_anthropic.h — the Anthropic Messages API (POST /v1/messages,
 * /v1/messages/count_tokens) <-> thaw's internal request (api.h). Its
 * table is thaw_codec_messages (codec.h): this parser, the message reply,
 * its stream's events, Anthropic's error shape and too-long sentence.
 *
 * A Messages request becomes the same struct thaw_chat_request a chat
 * completion does, so templates, tool parsing, grammar, slots, keys and
 * every cache tier see one form (DESIGN §13):
 *   system (string or text blocks), role "system" messages anywhere
 *                         -> system messages where they stand
 *   text blocks           -> content (joined)
 *   thinking blocks       -> reasoning_content (the signature is not rendered)
 *   tool_use blocks       -> tool_calls (input encoded as the arguments)
 *   tool_result blocks    -> tool messages (tool_call_id = tool_use_id)
 *   tools (input_schema)  -> function tools;  tool_choice auto/any/tool/none
 *   thinking enabled/adaptive/disabled -> chat_template_kwargs.enable_thinking;
 *     enabled's budget_tokens -> thinking_budget_tokens (the reasoning budget)
 *   output_config.effort  -> reasoning_effort (the template's kwarg)
 *   output_config.format  -> a JSON-schema grammar
 *   stop_sequences, temperature, top_p, top_k, max_tokens, stream
 * What varies per request without changing the conversation never reaches
 * the prompt: cache_control marks, metadata, and Claude Code's first
 * system block "x-anthropic-billing-header: ..." (it differs per
 * conversation and would break every shared prefix; logged once).
 * Images and documents are refused with a 400 naming the block.
 *
 * Builders return malloc'd NUL-terminated JSON text the caller frees (NULL
 * only on ENOMEM, or when message_json is not JSON).
 */
#ifndef THAW_API_ANTHROPIC_H
#define THAW_API_ANTHROPIC_H

#include "api/api.h"

#include <stdbool.h>
#include <stddef.h>

/* Parses a Messages request body into `out` (free with
 * thaw_chat_request_free). Returns 0, THAW_ENOMEM, or THAW_EINVAL with the
 * offending field named in err[errlen]; `out` is then empty.
 * `default_cache_prompt` is --cache-prompt. */
int thaw_anthropic_parse(const char *body, size_t len, bool default_cache_prompt, struct thaw_chat_request *out,
                         char *err, size_t errlen);

/* {"type":"error","error":{"type","message"}} with the type Anthropic
 * uses for `status` (invalid_request_error, authentication_error, ...). */
char *thaw_anthropic_error_json(int status, const char *message);

/* A non-streaming "message" object around `message_json` (the reply as
 * chat.h parses it: content, reasoning_content, tool_calls); its
 * stop_sequence is `stop_sequence` (the request's stop string that ended
 * the reply) or null. */
char *thaw_anthropic_message_json(const char *id, const char *model, const char *message_json,
                                  const char *finish_reason, const char *stop_sequence, int n_prompt,
                                  const struct thaw_timings *t);

/* {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
 * "output_tokens"}, as Anthropic splits the prompt: cache_read the tokens
 * reused (cache_n), cache_creation those this turn newly stores
 * (cache_new_n: thaw stores every turn whose prompt is long enough, so a
 * stored turn's input_tokens is 0), input_tokens the rest. */
char *thaw_anthropic_usage_json(int n_prompt, int cache_n, int cache_new_n, int output_tokens);

/* finish_reason ("stop" | "length" | "tool_calls") -> stop_reason
 * ("end_turn" | "max_tokens" | "tool_use"), or "stop_sequence" when one of
 * the request's stop_sequences ended the reply (stop_sequence not NULL);
 * a static string. */
const char *thaw_anthropic_stop_reason(const char *finish_reason, const char *stop_sequence);

/* A thinking block's signature: "thaw-" and a hash of the thinking text.
 * Clients echo it verbatim; thaw renders the thinking text, never this. */
#define THAW_ANTHROPIC_SIGNATURE_LEN 38
void thaw_anthropic_signature(const char *thinking, size_t n, char out[THAW_ANTHROPIC_SIGNATURE_LEN]);

/* How Claude Code's per-conversation system block begins. */
#define THAW_ANTHROPIC_BILLING_PREFIX "x-anthropic-billing-header:"

/* How Claude Code's prompt after a reply cut at max_tokens begins. It
 * sends one after each cut reply of a turn and records none of them: the
 * turn's later requests and every later turn carry the cut replies as
 * consecutive assistant messages. So only the request's last message is
 * rendered when it is one (marked last_transient, api.h); earlier ones are
 * left out, and every request renders the history the next turn renders. */
#define THAW_ANTHROPIC_RECOVERY_PREFIX "Output token limit hit. Resume directly"

#endif
