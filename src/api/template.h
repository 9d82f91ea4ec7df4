/* template.h — llama.cpp's chat library (libllama-common, common/chat.h)
 * behind a C interface: Jinja templates, tools, reasoning, tool-call
 * parsing, JSON-schema grammars.
 *
 * The one C++ file of thaw (template.cpp) implements it; every exception is
 * caught at this boundary and becomes THAW_EINVAL with the reason in `err`.
 * Requests and results cross as JSON text (the library speaks JSON; thaw's C
 * side reads it with jansson), so no C++ type leaks into C.
 *
 * Thread safety: a thaw_tmpl is read-only after thaw_tmpl_new; apply, parse
 * and diffs may run on any thread at once.
 */
#ifndef THAW_TEMPLATE_H
#define THAW_TEMPLATE_H

#include <llama.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct thaw_tmpl;

/* Loads the model's chat template(s), or `override_src` (template text;
 * NULL = the model's, chatml when it has none). `use_jinja` false renders
 * through llama.cpp's built-in templates (no tools). Then runs a self-test:
 * a known template rendered with a tool and a tool call parsed back, so a
 * library that disagrees with the headers thaw was built with refuses to
 * start instead of misbehaving. Returns 0, THAW_EINVAL (reason in err) or
 * THAW_ENOMEM. */
int thaw_tmpl_new(const struct llama_model *model, const char *override_src, bool use_jinja, struct thaw_tmpl **out,
                  char *err, size_t errlen);
void thaw_tmpl_free(struct thaw_tmpl *t);

/* The template's source text (or built-in name). Owned by t. */
const char *thaw_tmpl_source(const struct thaw_tmpl *t);
/* Whether tools can be rendered (Jinja on). */
bool thaw_tmpl_jinja(const struct thaw_tmpl *t);

/* Renders a request. `inputs_json`:
 *   {"messages": [OpenAI messages], "tools": [OpenAI tools] | absent,
 *    "tool_choice": "auto"|"none"|"required", "parallel_tool_calls": bool,
 *    "json_schema": {...} | absent, "add_generation_prompt": bool,
 *    "continue_final_message": true | absent (the last message, an
 *    assistant prefill, rendered open for the reply to continue),
 *    "chat_template_kwargs": {...}, "reasoning_format": "none"|"deepseek"|"auto"}
 * Returns malloc'd JSON (caller frees):
 *   {"prompt": s, "grammar": s, "grammar_lazy": b,
 *    "triggers": [{"type": 0 token|1 word|2 pattern|3 full pattern, "value": s, "token": i}],
 *    "preserved_tokens": [s], "additional_stops": [s],
 *    "parser": {"format": i, "generation_prompt": s, "peg": s, "reasoning_format": s},
 *    "thinking": {"start": s, "ends": [s]} | null (the template has no thinking block)}
 * or NULL with the reason in err (a template error, a bad tool schema). */
char *thaw_tmpl_apply(const struct thaw_tmpl *t, const char *inputs_json, char *err, size_t errlen);

/* Parses generated text with the "parser" object of an apply result.
 * `is_partial`: the text may stop mid-way (streaming). Returns malloc'd
 * JSON of the assistant message: {"role", "content", "reasoning_content"?,
 * "tool_calls"?: [{"type","function":{"name","arguments"},"id"}]}, or NULL
 * with the reason in err. */
char *thaw_tmpl_parse(const char *parser_json, const char *text, bool is_partial, char *err, size_t errlen);

/* The OpenAI stream deltas from one parsed message to the next. Returns a
 * malloc'd JSON array of {"content"?, "reasoning_content"?, "tool_call_index"?,
 * "name"?, "arguments"?, "id"?}, or NULL with the reason in err. */
char *thaw_tmpl_diffs(const char *prev_msg_json, const char *next_msg_json, char *err, size_t errlen);

/* A JSON schema (text) as the GBNF grammar that only lets matching JSON
 * through (llama.cpp's json_schema_to_grammar): malloc'd, or NULL with the
 * reason in err (not JSON, a schema it cannot convert). For a raw prompt or
 * --no-jinja, where no template renders the schema. */
char *thaw_tmpl_schema_grammar(const char *schema_json, char *err, size_t errlen);

/* llama-server's system_fingerprint: llama_build_info() of the llama.cpp
 * (libllama-common) thaw runs on, "b<build number>-<commit>". Static. */
const char *thaw_tmpl_build_fingerprint(void);

/* libllama's samplers are C++ inside: a grammar that cannot go on (a
 * token it does not allow) throws, and an exception crossing thaw's C
 * frames would end the process. These call them with everything caught.
 * Return 0, or THAW_EINVAL (the reason in err) and the sampler must not be
 * used again. */
int thaw_tmpl_sampler_accept(struct llama_sampler *smpl, llama_token tok, char *err, size_t errlen);
int thaw_tmpl_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx, int idx, llama_token *out,
                             char *err, size_t errlen);
/* The same as thaw_tmpl_sampler_sample, done as llama_sampler_sample does
 * it on the CPU, keeping what the chain left: the candidates from the
 * logits at row idx are written to buf (n_vocab of room), the chain
 * applied to them and the pick accepted; *cur is the result (its data in
 * buf, probabilities where the chain computed them, 0 elsewhere) and its
 * `selected` the sampled token. */
int thaw_tmpl_sampler_sample_cur(struct llama_sampler *smpl, struct llama_context *ctx, int idx, llama_token_data *buf,
                                 int n_vocab, llama_token_data_array *cur, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
