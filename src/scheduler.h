/* scheduler.h — the wait queue in front of the slots, and which slot a task gets.
 *
 * HTTP threads push tasks; the engine thread pops them when a slot is free.
 * The queue is bounded (--max-queue): a push beyond it fails at once with
 * THAW_EBUSY, which the route answers with 503 — back-pressure instead of an
 * unbounded pile of waiting connections.
 */
#ifndef THAW_SCHEDULER_H
#define THAW_SCHEDULER_H

#include "task.h"
#include "tokens.h"

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

/* Puts a task just popped back at the head of the queue (its reference
 * moves back to the queue). Never fails: the queue keeps room for one. */
void thaw_sched_unpop(struct thaw_sched *s, struct thaw_task *t);

/* Number of tasks waiting. */
int thaw_sched_depth(struct thaw_sched *s);

/* Wakes a blocked pop without a task (for shutdown). */
void thaw_sched_kick(struct thaw_sched *s);
/* Refuses further pushes; queued tasks stay for pop. */
void thaw_sched_close(struct thaw_sched *s);

/* ---- slot choice (pure: unit-tested) ---- */

struct thaw_slot_view {
    bool idle;
    const llama_token *tokens; /* what the slot's KV holds */
    int n_tokens;
    int64_t last_used_us;
    bool holds_key;            /* the slot holds `key` of the task's lookup */
};


/* Picks an idle slot for a prompt: the slot holding the conversation's key,
 * else the one whose held tokens share the largest fraction of the prompt
 * above `similarity` (0 disables), else the least recently used. Returns the
 * index or -1 when none is idle. */
int thaw_sched_pick_slot(const struct thaw_slot_view *slots, int n_slots, const llama_token *prompt, int n_prompt,
                         float similarity);

#endif
