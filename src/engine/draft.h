/* draft.h — the draft model for speculative decoding.
 *
 * A second, small model in its own llama_context, one sequence per slot
 * (seq id = slot id). For each generating slot the engine asks it to catch
 * up with the target's accepted tokens (thaw_draft_sync) and to propose a
 * few next tokens (thaw_draft_propose); the target then verifies them all in
 * one batch. The draft never decides output: every emitted token is the
 * target's own sample. Engine thread only.
 */
#ifndef THAW_DRAFT_H
#define THAW_DRAFT_H

#include "base/config.h"

#include <llama.h>
#include <stddef.h>

#define THAW_DRAFT_MAX 256 /* upper bound of --draft-max */

struct thaw_draft;

/* Loads cfg->draft_path and creates its context (cfg->n_ctx_draft, or the
 * target's cfg->n_ctx, split over n_slots sequences). Refuses a draft whose
 * vocabulary differs from the target's (logged, THAW_EMISMATCH). Returns 0,
 * THAW_ELLAMA, THAW_EMISMATCH or THAW_ENOMEM. */
int thaw_draft_new(const struct thaw_config *cfg, const struct llama_model *target, int n_slots,
                   struct thaw_draft **out);
void thaw_draft_free(struct thaw_draft *d);

/* Tokens one draft sequence can hold. */
int thaw_draft_n_ctx_seq(const struct thaw_draft *d);

/* Makes sequence `seq` hold exactly tokens[0..n): keeps the common prefix
 * with what it holds, decodes the rest. Returns the number of tokens it had
 * to decode (>= 0) or THAW_ELLAMA (the sequence is then empty). */
int thaw_draft_sync(struct thaw_draft *d, int seq, const llama_token *tokens, int n);

/* After a sync to tokens[0..n): decodes `last` at position n and drafts
 * greedily up to `max` tokens into out[], stopping early when the top
 * token's probability falls below `p_min`. Returns the number drafted (0 on
 * any failure: speculation is an optimisation, never an error). */
int thaw_draft_propose(struct thaw_draft *d, int seq, llama_token last, int max, float p_min, llama_token *out);

/* Forgets sequence seq. */
void thaw_draft_clear(struct thaw_draft *d, int seq);

/* The .dft blob (kvstate format) of seq, a blob (blob.h). Returns 0, THAW_ENOMEM or
 * THAW_ELLAMA. */
int thaw_draft_capture(struct thaw_draft *d, int seq, void **out, size_t *n_out);

/* Installs a .dft blob into seq. Returns the tokens it holds (>= 0) or a
 * negative error (seq then empty: the next sync prefills it). */
int thaw_draft_restore(struct thaw_draft *d, int seq, const void *blob, size_t n);

#endif
