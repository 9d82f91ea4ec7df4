/* ngram.h — drafts copied from the conversation itself (--spec-type
 * ngram-*): llama-server's self-speculation, one index per slot.
 *
 * An agent's reply copies what is in its context (the file it edits, the
 * diff, a tool's output). Each slot indexes the n-grams of the tokens its
 * KV holds (the whole conversation, whether prefilled, reused from the
 * slot or restored from a cache tier); when the last N tokens (the one just
 * sampled included) occurred before, the tokens that followed that
 * occurrence are the draft. The target verifies every draft with the
 * request's own sampler (generate.c), so a draft changes speed, never
 * output.
 *
 * The kinds, tried in this order until one drafts (llama-server's order):
 *   ngram-simple   the key's latest earlier occurrence; up to size_m of the
 *                  tokens after it.
 *   ngram-map-k    as simple, and each key remembers how many of its draft
 *                  the target accepted: it drafts no more than that next
 *                  time (0: the key drafts no more in this request).
 *   ngram-map-k4v  the continuations (size_m tokens) of the key's earlier
 *                  occurrences are counted, up to 4 different ones; the most
 *                  frequent is drafted when it is at least twice as frequent
 *                  as the others together; accepted counts as map-k, per
 *                  continuation.
 *   ngram-mod      one token at a time: the token that followed the latest
 *                  occurrence of the last size_n tokens (drafted ones
 *                  included), up to size_m; shorter than n_min: no draft.
 * min_hits (not ngram-mod): the key must have occurred that many times.
 *
 * What "follows" an occurrence may run into the tokens the key itself is
 * made of and on into the draft (as an LZ77 copy may overlap its source):
 * a loop of period p is drafted for as long as size_m allows, not just p
 * tokens.
 *
 * Isolation: an index holds the n-grams of its slot's tokens and nothing
 * else (thaw_ngram_draft first forgets every n-gram past the common prefix
 * with what it indexed), and what the kinds learn from verdicts (map-k's
 * accepted counts) is forgotten by thaw_ngram_begin at each request: no
 * request drafts from another's tokens, and no tenant's timing depends on
 * another's conversation. Engine thread only.
 */
#ifndef THAW_NGRAM_H
#define THAW_NGRAM_H

#include "base/config.h"

#include <llama.h>

#define THAW_NGRAM_MAX 1024 /* upper bound of --spec-ngram-*-size-m */

struct thaw_ngram;

/* The n-gram drafter of one slot, for the kinds cfg->spec_types names.
 * n_ctx: tokens the slot can hold (sizes the hash table). Returns 0 and
 * *out (NULL when no n-gram kind is on), or THAW_ENOMEM. */
int thaw_ngram_new(const struct thaw_config *cfg, int n_ctx, struct thaw_ngram **out);
void thaw_ngram_free(struct thaw_ngram *g); /* NULL: nothing */

/* Whether any n-gram kind is on in cfg; the longest draft one can make. */
bool thaw_ngram_enabled(const struct thaw_config *cfg);
int thaw_ngram_max_draft(const struct thaw_config *cfg);

/* A new request in the slot: forgets what verdicts taught (map-k's
 * accepted counts). The index follows the tokens (thaw_ngram_draft). */
void thaw_ngram_begin(struct thaw_ngram *g);

/* Makes the index hold tokens[0..n) (what the slot's KV holds), then
 * drafts what follows tokens[0..n) + `next` (sampled, not decoded yet):
 * up to max tokens into out[]. Returns the number drafted (0: no kind found
 * one; also on ENOMEM: speculation is an optimisation, never an error). */
int thaw_ngram_draft(struct thaw_ngram *g, const llama_token *tokens, int n, llama_token next, int max,
                     llama_token *out);

/* The target's verdict on the last draft: n_accepted of its tokens. */
void thaw_ngram_accept(struct thaw_ngram *g, int n_accepted);

/* The kind that made the last draft ("ngram-simple", ...), for logs. */
const char *thaw_ngram_last_kind(const struct thaw_ngram *g);

#endif
