/* budget.h — the reasoning budget: a stage of a request's sampler chain
 * (sampler.c) that counts the tokens generated inside the template's
 * thinking block and, when they reach the budget, forces the block's end
 * (the budget message, if any, then the template's end tag, tokenized).
 *
 * llama-server's --reasoning-budget (common/reasoning-budget.cpp) does the
 * same with token sequences; this stage matches the tags on the text the
 * tokens spell, so a tag split across tokens differently than when it was
 * tokenized alone (">\n" in "<think>\n") is still seen.
 *
 * States (one writer: the stage's accept):
 *   IDLE      outside thinking, watching for the start tag
 *   COUNTING  inside, counting down; an end tag ends it naturally (DONE)
 *   WAIT_UTF8 budget spent inside a UTF-8 character: let it finish
 *   FORCING   every logit but the next forced token's is -inf
 *   DONE      after the block; a new start tag re-arms it (COUNTING)
 *
 * The stage never fights a grammar: it sits after the grammar in the
 * chain, and when the token it must force is already at -inf there (the
 * grammar, or a logit bias, forbids it), it gives up forcing (DONE) and
 * leaves the logits alone. A forced token accepted as anything else (the
 * chain picked another) ends forcing the same way.
 *
 * Speculative decoding needs nothing more: the verify path samples each
 * drafted position in order with the same chain, so the stage accepts
 * exactly the tokens the reply keeps.
 *
 * Engine thread (libllama samplers are not shared).
 */
#ifndef THAW_BUDGET_H
#define THAW_BUDGET_H

#include <llama.h>
#include <stdbool.h>

enum thaw_budget_state {
    THAW_BUDGET_IDLE,
    THAW_BUDGET_COUNTING,
    THAW_BUDGET_WAIT_UTF8,
    THAW_BUDGET_FORCING,
    THAW_BUDGET_DONE,
};

struct thaw_budget_params {
    const char *start;        /* the start-of-thinking tag, e.g. "<think>" (non-empty) */
    const char *const *ends;  /* the tags that end thinking naturally, n_ends >= 1 */
    int n_ends;
    const llama_token *forced; /* forced when the budget is spent: the message + ends[0], tokenized */
    int n_forced;             /* >= 1 */
    int budget;               /* tokens allowed inside the block; 0 = end it at once */
};

/* A new stage (copies everything in p). `vocab` renders accepted tokens
 * (special tokens as their text). NULL on ENOMEM or bad params. Freed by
 * llama_sampler_free, or with the chain it was added to. */
struct llama_sampler *thaw_budget_new(const struct llama_vocab *vocab, const struct thaw_budget_params *p);

/* Text already in the prompt before the first generated token (the
 * template's generation prompt, e.g. "<|im_start|>assistant\n<think>\n"):
 * scanned for the tags as if generated, without counting, so a block the
 * prompt opens is inside thinking from the first token, and one it opens
 * and closes (thinking off) is done. */
void thaw_budget_feed(struct llama_sampler *smpl, const char *text);

enum thaw_budget_state thaw_budget_state(const struct llama_sampler *smpl);
/* Tokens generated inside thinking blocks so far (forced ones excluded). */
int thaw_budget_n_thinking(const struct llama_sampler *smpl);
/* Whether the budget ever forced an end (a block cut short). */
bool thaw_budget_forced(const struct llama_sampler *smpl);
/* Whether smpl is a budget stage. */
bool thaw_budget_is(const struct llama_sampler *smpl);

#endif
