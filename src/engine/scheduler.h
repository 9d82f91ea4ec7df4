/* scheduler.h — the wait queue in front of the slots, and the plan of each
 * engine step: which slot a task gets, and what post-reply work may run.
 *
 * HTTP threads push tasks; the engine thread pops them when a slot is free.
 * The queue is bounded (--max-queue): a push beyond it fails at once with
 * THAW_EBUSY, which the route answers with 503 — back-pressure instead of an
 * unbounded pile of waiting connections.
 *
 * The plan is pure functions over views of the slots (thaw_slot_view): the
 * engine builds the views, asks, and carries the answer out (slot.h moves
 * the slots). The policy, in one place:
 *   - admission (thaw_sched_admit): a request never waits for another
 *     request's post-reply work (FIXUP). It takes an idle slot (the one
 *     holding its conversation, else the most similar, else the least
 *     recently used), or cuts short the FIXUP of a slot holding more of its
 *     prompt than cutting costs that slot's conversation (it would prefill
 *     those very tokens anyway), or, with no idle slot, the FIXUP slot the
 *     same choice picks. A FIXUP with only its store left (or, with
 *     --fixup-wait-ms, less than that left) is waited for instead.
 *   - the FIXUP budget (thaw_sched_fixup_room, thaw_sched_fixup_due):
 *     FIXUP is work nobody waits for, so it must not slow a request that
 *     is. Alone it runs in slices of about THAW_FIXUP_SLICE_US; beside a
 *     prompt it waits; beside generation it waits THAW_FIXUP_DEFER_US, then
 *     THAW_FIXUP_PIGGYBACK tokens ride along each step, so a busy server
 *     still stores within seconds. Its store waits the same way when
 *     it is a whole capture; from the tap (a few rows) it goes at once,
 *     and a re-decode that will not be done soon stores the reply as it
 *     stands first (engine.c, store_early).
 *   - a prompt beside generating streams (thaw_sched_batch_room): one
 *     micro-batch of it per step, so no stream waits for a whole batch.
 */
#ifndef THAW_SCHEDULER_H
#define THAW_SCHEDULER_H

#include "engine/task.h"
#include "llama/tokens.h"

#include <stdbool.h>

struct thaw_sched;

/* Returns 0 or THAW_ENOMEM. */
/* `max_queue` < 1 is taken as 1. */
int thaw_sched_new(int max_queue, struct thaw_sched **out);
/* Fails every task still queued with 503 and frees the queue. */
void thaw_sched_free(struct thaw_sched *s);

/* Takes a reference on success. Returns 0, THAW_EBUSY (queue full) or
 * THAW_ESHUTDOWN (closed). */
int thaw_sched_push(struct thaw_sched *s, struct thaw_task *t);

/* Pops the oldest task (the caller owns the queue's reference) or NULL.
 * With `wait`, blocks until a task arrives or thaw_sched_close/kick. */
struct thaw_task *thaw_sched_pop(struct thaw_sched *s, bool wait);

/* thaw_sched_pop with `wait`, but for at most wait_us microseconds
 * (< 0: no limit); NULL when that passes first. */
struct thaw_task *thaw_sched_pop_for(struct thaw_sched *s, int64_t wait_us);

/* Puts a task just popped back at the head of the queue (its reference
 * moves back to the queue). Never fails: the queue keeps room for one. */
void thaw_sched_unpop(struct thaw_sched *s, struct thaw_task *t);

/* Number of tasks waiting. */
int thaw_sched_depth(struct thaw_sched *s);

/* Wakes a blocked pop without a task (shutdown, a restore assembled). */
void thaw_sched_kick(struct thaw_sched *s);
/* Waits up to wait_us for a kick (or close), taking no task: the engine
 * when nothing can decode until a restore is assembled. */
void thaw_sched_wait_kick(struct thaw_sched *s, int64_t wait_us);
/* Refuses further pushes; queued tasks stay for pop. */
void thaw_sched_close(struct thaw_sched *s);

/* ---- planning a step (pure: unit-tested) ---- */

/* FIXUP tokens a generation step carries once the FIXUP has waited
 * THAW_FIXUP_DEFER_US for the engine to be free; a FIXUP alone runs in
 * slices of about THAW_FIXUP_SLICE_US of decoding. (On a CPU a batch's cost
 * grows with its tokens: measured, 20 re-decoded tokens batched with a
 * 9-token prompt made that prompt take 1.6 s instead of ~0.3; 2 riding
 * along each generation step halved its speed.) */
#define THAW_FIXUP_PIGGYBACK 2
#define THAW_FIXUP_DEFER_US 2000000
#define THAW_FIXUP_SLICE_US 50000.0

/* A slot as the plan sees it, for one waiting task. */
struct thaw_slot_view {
    bool idle;                 /* free for a task */
    bool fixup;                /* busy with post-reply work, which a task may cut short */
    const llama_token *tokens; /* what the slot's KV holds */
    int n_tokens;              /* 0 when they are another tenant's: never a prefix for this one */
    int64_t last_used_us;
    bool holds_key;            /* the slot holds the conversation of the task's lookup key */
    bool next_turn;            /* FIXUP: it stores the conversation the task is the next turn of */
    int fix_left;              /* FIXUP: tokens it has left to re-decode */
};

/* The waiting task as the plan sees it. */
struct thaw_sched_task_view {
    const llama_token *prompt;
    int n_prompt;
    bool cache_prompt; /* the request lets the slot's tokens be reused */
};

struct thaw_sched_params {
    float similarity;        /* --slot-prompt-similarity, 0 = off */
    int fixup_wait_ms;       /* --fixup-wait-ms */
    double fixup_us_per_tok; /* what a FIXUP token costs to decode so far (moving average), 0 = unknown */
};

enum thaw_sched_action {
    THAW_SCHED_NONE,  /* no slot for it: it goes back to the head of the queue */
    THAW_SCHED_START, /* start it on `slot`, which is idle */
    THAW_SCHED_CUT,   /* cut `slot`'s FIXUP short, then start it there */
    THAW_SCHED_WAIT,  /* put it back and finish `slot`'s FIXUP at full speed first */
};

struct thaw_sched_admission {
    enum thaw_sched_action action;
    int slot; /* -1 with THAW_SCHED_NONE */
};

/* Picks an idle slot for a prompt: the slot holding the conversation's key,
 * else the one whose held tokens share the largest fraction of the prompt
 * above `similarity` (0 disables), else the least recently used. Returns the
 * index or -1 when none is idle. */
int thaw_sched_pick_slot(const struct thaw_slot_view *slots, int n_slots, const llama_token *prompt, int n_prompt,
                         float similarity);

/* Where a waiting task goes (the policy at the top). `similarity` is applied
 * only when t->cache_prompt. */
struct thaw_sched_admission thaw_sched_admit(const struct thaw_slot_view *slots, int n_slots,
                                             const struct thaw_sched_task_view *t,
                                             const struct thaw_sched_params *p);

/* The most tokens this step's batch may hold once the generating slots'
 * `n_gen_tokens` (their next tokens and drafts) are in: a prompt fills the
 * rest. With nothing generating, the whole batch (n_batch: a prompt goes
 * fastest). While streams generate, a step is every stream's gap between
 * tokens, so a prompt rides in pieces: at most one micro-batch (n_ubatch;
 * libllama computes a batch one micro-batch after the other, so n_batch
 * prompt tokens would hold every stream for n_batch / n_ubatch of them),
 * and no more than fit in THAW_STREAM_STEP_US at `us_per_tok` (the
 * measured cost of a batch token; 0 = unknown), but never under
 * THAW_PROMPT_CHUNK_MIN tokens (smaller batches compute a prompt less
 * efficiently). The prompt loses only the few generation tokens riding in
 * each piece; the streams never stall for a long prompt beside them. */
#define THAW_STREAM_STEP_US 100000.0
#define THAW_PROMPT_CHUNK_MIN 32
int thaw_sched_batch_room(int n_gen_tokens, int n_batch, int n_ubatch, double us_per_tok);

/* FIXUP tokens this step's batch may carry after the prompts and
 * generation steps (n_batch at most), given how many slots prefill and
 * generate and whether a waiting request awaits a FIXUP (full speed). */
int thaw_sched_fixup_room(int n_prefill, int n_gen, bool awaited, double fixup_us_per_tok, int n_batch);

/* Whether a FIXUP slot's tokens (or its store) may go now: when it slows
 * nobody (`free_now`: no slot prefills or generates, or a request awaits
 * it), or once it has waited THAW_FIXUP_DEFER_US. */
bool thaw_sched_fixup_due(bool free_now, int64_t waited_us);

/* The cost of a FIXUP token after a batch of FIXUP tokens only took
 * `batch_us` for `n_tokens`: a moving average over such batches. */
double thaw_sched_fixup_cost(double fixup_us_per_tok, int64_t batch_us, int n_tokens);

/* The cost of a token in a prompt piece beside streams (what
 * thaw_sched_batch_room sizes pieces by) after a batch of `n_tokens`,
 * `n_prompt` of them prompt and `n_gen` generation, took `batch_us`: a
 * moving average over such pieces. A prompt's batch with nothing
 * generating (hundreds of tokens, each cheaper: 1.4 against 2.5 ms on a
 * 2-core VM) only gives the first guess: counted always, every piece
 * after it overshot the step by that much. Batches of fewer than
 * THAW_PROMPT_CHUNK_MIN / 2 prompt tokens do not count. */
double thaw_sched_prompt_cost(double prompt_us_per_tok, int64_t batch_us, int n_tokens, int n_prompt, int n_gen);

#endif
