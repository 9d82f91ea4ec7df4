/* slots_view.h — what GET /slots shows: each slot's conversation as the
 * engine last published it.
 *
 * The slots belong to the engine thread; HTTP threads never read them.
 * Instead the engine publishes a slot's state at each phase move (slot.c's
 * thaw_slot_move) and when it stores (the tiers it went to), into this
 * view under its own mutex; GET /slots copies it out. So the view is at most
 * one phase behind, and no HTTP thread ever waits for a decode step.
 */
#ifndef THAW_SLOTS_VIEW_H
#define THAW_SLOTS_VIEW_H

#include "base/key.h"

#include <llama.h>
#include <stdbool.h>
#include <stdint.h>

struct thaw_slots_view;
struct thaw_slot;
struct thaw_chat;

/* A view of n_slots slots of n_ctx tokens each. NULL on ENOMEM. */
struct thaw_slots_view *thaw_slots_view_new(int n_slots, int n_ctx, bool speculative);
void thaw_slots_view_free(struct thaw_slots_view *v);

/* Engine thread: slot s as it is now (phase, the tokens its KV holds, where
 * its prompt came from, its tenant). A failed copy (ENOMEM) keeps the
 * previous tokens. NULL v: nothing. */
void thaw_slots_view_publish(struct thaw_slots_view *v, const struct thaw_slot *s);
/* Engine thread: slot `id`'s conversation was stored to `tiers` ("ram+disk",
 * static string). */
void thaw_slots_view_stored(struct thaw_slots_view *v, int id, const char *tiers);

/* Any thread: llama-server's GET /slots array, one object per slot: id,
 * n_ctx, speculative, is_processing (a request in flight: PREFILL or GEN),
 * n_prompt_tokens, n_prompt_tokens_cache, prompt (the text the KV holds),
 * next_token [{has_next_token, n_remain, n_decoded}: -1 and 0 with no
 * request, so a finished request's budget does not linger], plus
 * "thaw": {phase, n_tokens, cache_source, stored_to, draft_n,
 * draft_n_accepted, draft_acceptance_rate (of the request in progress, or
 * the last one)}. speculative: the slots draft (n-grams or a draft model). The prompt text is
 * shown only for slots holding namespace `ns`'s tokens (with API keys, no
 * tenant reads another's conversation). malloc'd JSON, NULL on ENOMEM. */
char *thaw_slots_view_json(struct thaw_slots_view *v, const struct thaw_chat *chat, const uint8_t ns[THAW_KEY_BYTES]);

#endif
