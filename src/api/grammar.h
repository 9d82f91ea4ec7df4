/* grammar.h — reshaping the chat library's GBNF grammar for a request.
 *
 * llama.cpp's chat library (template.h) gives each template's tool-call
 * grammar. It is written for trained models, which call at once and close
 * what they open. Two things it leaves open matter to a server that
 * promises a call: with tool_choice "required" the grammar still lets a
 * reply say anything first, and some families' argument rules are generic
 * (Gemma 4's take any dict, whatever the tool's schema). These functions
 * return a new grammar (malloc'd; the caller frees it) or NULL when the
 * grammar has another shape (the caller keeps the original) or on OOM.
 */
#ifndef THAW_GRAMMAR_H
#define THAW_GRAMMAR_H

#include <stdbool.h>

/* tool_choice "required": the root loses every element that can match
 * nothing (optional, repeated, or an until-rule), so what is left leads
 * straight to the call; with `parallel` false the calls rule loses its `+`.
 * NULL for a root with alternatives at the top. */
char *thaw_grammar_force_call(const char *grammar, bool parallel);

/* Every character class repeated without bound (`[...]+`, `[...]*`)
 * bounded at 64, and every until-rule (`until-N`: text up to a delimiter)
 * made at most 64 characters without the delimiter's first, so no run
 * inside a required call can go on forever. Returns a new grammar
 * (malloc'd; the caller frees it) or NULL when out of memory. */
char *thaw_grammar_bound_repeats(const char *grammar);

/* Gemma 4 (rules `tool-NAME ::= ("NAME") gemma4-dict`): each tool's
 * arguments follow its own JSON schema, in Gemma 4's argument syntax
 * (bare keys, strings between <|"|>), so enums, required keys and types
 * hold. Schemas or parts of them this does not compile (anyOf, $ref, ...)
 * keep the generic value. `tools_json` is the request's validated 'tools'
 * array. NULL when the grammar is not Gemma 4's. */
char *thaw_grammar_gemma4_args(const char *grammar, const char *tools_json);

#endif
