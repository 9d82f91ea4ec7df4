/* test_scheduler.c — the bounded queue, slot choice, admission and the FIXUP budget. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/scheduler.h"

static struct thaw_task *task(void)
{
    struct thaw_chat_request req;

    memset(&req, 0, sizeof req);
    return thaw_task_new(&req, NULL, 0);
}

static void test_queue_bounded_fifo(void **state)
{
    struct thaw_sched *s;
    struct thaw_task *a = task(), *b = task(), *c = task();

    (void)state;
    assert_int_equal(thaw_sched_new(2, &s), 0);
    assert_int_equal(thaw_sched_push(s, a), 0);
    assert_int_equal(thaw_sched_push(s, b), 0);
    assert_int_equal(thaw_sched_push(s, c), THAW_EBUSY);
    assert_int_equal(thaw_sched_depth(s), 2);
    struct thaw_task *x = thaw_sched_pop(s, false);
    assert_ptr_equal(x, a);
    thaw_task_release(x);
    assert_int_equal(thaw_sched_push(s, c), 0); /* room again; ring wraps */
    x = thaw_sched_pop(s, false);
    assert_ptr_equal(x, b);
    thaw_task_release(x);
    thaw_sched_close(s);
    assert_int_equal(thaw_sched_push(s, a), THAW_ESHUTDOWN);
    assert_null(thaw_sched_pop(s, true) == c ? NULL : (void *)1); /* closed: pop still drains */
    thaw_task_release(c);
    assert_null(thaw_sched_pop(s, true)); /* closed and empty: does not block */
    thaw_sched_free(s);
    thaw_task_release(a);
    thaw_task_release(b);
    thaw_task_release(c);
}

static void test_free_fails_queued_tasks(void **state)
{
    struct thaw_sched *s;
    struct thaw_task *a = task();

    (void)state;
    assert_int_equal(thaw_sched_new(4, &s), 0);
    assert_int_equal(thaw_sched_push(s, a), 0);
    thaw_sched_free(s);
    assert_true(a->done);
    assert_int_equal(a->http_status, 503);
    thaw_task_release(a);
}

static void test_pick_slot(void **state)
{
    const llama_token p[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const llama_token held0[] = {1, 2, 9};
    const llama_token held1[] = {1, 2, 3, 4, 5, 6, 0};
    struct thaw_slot_view v[3] = {
        {.idle = true, .tokens = held0, .n_tokens = 3, .last_used_us = 100},
        {.idle = true, .tokens = held1, .n_tokens = 7, .last_used_us = 300},
        {.idle = true, .tokens = NULL, .n_tokens = 0, .last_used_us = 50},
    };

    (void)state;
    /* similarity: slot 1 shares 6/10 */
    assert_int_equal(thaw_sched_pick_slot(v, 3, p, 10, 0.1f), 1);
    /* above the threshold nothing qualifies: least recently used */
    assert_int_equal(thaw_sched_pick_slot(v, 3, p, 10, 0.7f), 2);
    /* similarity off: LRU */
    assert_int_equal(thaw_sched_pick_slot(v, 3, p, 10, 0.0f), 2);
    /* the slot holding the conversation's key wins */
    v[0].holds_key = true;
    assert_int_equal(thaw_sched_pick_slot(v, 3, p, 10, 0.1f), 0);
    /* busy slots are never picked */
    v[0].idle = v[1].idle = v[2].idle = false;
    assert_int_equal(thaw_sched_pick_slot(v, 3, p, 10, 0.1f), -1);
    assert_int_equal(thaw_lcp(p, 10, held1, 7), 6);
    assert_int_equal(thaw_lcp(p, 0, held1, 7), 0);
}


static const llama_token prompt10[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};

/* An idle slot wins over FIXUP ones, whatever they hold, unless a FIXUP
 * slot holds more of the prompt than cutting it short costs. */
static void test_admit_prefers_idle_unless_a_fixup_holds_more(void **state)
{
    const llama_token warm[] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct thaw_slot_view v[2] = {
        {.idle = true, .last_used_us = 10},
        {.fixup = true, .tokens = warm, .n_tokens = 8, .fix_left = 3},
    };
    const struct thaw_sched_task_view t = {prompt10, 10, true};
    const struct thaw_sched_params p = {0.5f, 0, 1000.0}; /* 1 ms a token, no wait */
    struct thaw_sched_admission a;

    (void)state;
    /* 8 tokens gained > 3 left to re-decode: cut it short */
    a = thaw_sched_admit(v, 2, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    assert_int_equal(a.slot, 1);
    /* more left than it gains: the idle slot */
    v[1].fix_left = 8;
    a = thaw_sched_admit(v, 2, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_START);
    assert_int_equal(a.slot, 0);
    /* the task's previous turn, still storing: always that slot */
    v[1].next_turn = true;
    a = thaw_sched_admit(v, 2, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    assert_int_equal(a.slot, 1);
    /* without cache_prompt nothing of a slot is reused: the idle one */
    const struct thaw_sched_task_view cold = {prompt10, 10, false};
    a = thaw_sched_admit(v, 2, &cold, &p);
    assert_int_equal(a.action, THAW_SCHED_START);
    assert_int_equal(a.slot, 0);
    /* another tenant's tokens are no gain (the engine zeroes n_tokens) */
    v[1].next_turn = false;
    v[1].fix_left = 0;
    v[1].n_tokens = 0;
    a = thaw_sched_admit(v, 2, &t, &p);
    assert_int_equal(a.slot, 0);
}

/* With no idle slot a FIXUP is cut short, chosen as an idle one would be,
 * unless only its store is left, or what it has left takes no longer than
 * --fixup-wait-ms (> 0): then the task waits for it. */
static void test_admit_without_idle_cuts_or_waits(void **state)
{
    const llama_token a5[] = {1, 2, 3, 4, 5};
    struct thaw_slot_view v[3] = {
        {.fixup = true, .last_used_us = 5, .fix_left = 100},
        {.fixup = true, .tokens = a5, .n_tokens = 5, .last_used_us = 9, .fix_left = 100},
        {.idle = false}, /* prefilling or generating: never */
    };
    const struct thaw_sched_task_view t = {prompt10, 10, true};
    struct thaw_sched_params p = {0.3f, 50, 1000.0};
    struct thaw_sched_admission a;

    (void)state;
    /* 100 tokens at 1 ms > 50 ms: cut the most similar short */
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    assert_int_equal(a.slot, 1);
    /* similarity off: the least recently used */
    p.similarity = 0;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    assert_int_equal(a.slot, 0);
    /* 40 tokens left at 1 ms fit in 50 ms: wait for it */
    v[0].fix_left = 40;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_WAIT);
    assert_int_equal(a.slot, 0);
    /* cost unknown yet: what is left counts as nothing, so it is waited for */
    v[0].fix_left = 100000;
    p.fixup_us_per_tok = 0;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_WAIT);
    /* the default, --fixup-wait-ms 0: cut whatever is left, known cost or
     * not (the cut conversation prefills it in its next turn's batch)... */
    p.fixup_wait_ms = 0;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    p.fixup_us_per_tok = 1000.0;
    v[0].fix_left = 1;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_CUT);
    assert_int_equal(a.slot, 0);
    /* ...but one with only its store left is waited for */
    v[0].fix_left = 0;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_WAIT);
    assert_int_equal(a.slot, 0);
    /* nothing open */
    v[0].fixup = v[1].fixup = false;
    a = thaw_sched_admit(v, 3, &t, &p);
    assert_int_equal(a.action, THAW_SCHED_NONE);
    assert_int_equal(a.slot, -1);
}

/* A prompt piece's cost is learnt from pieces beside streams; a prompt's
 * batch alone only seeds it. */
static void test_prompt_cost(void **state)
{
    (void)state;
    /* unknown: any prompt batch seeds it, 700 tokens alone in 1 s */
    assert_true(fabs(thaw_sched_prompt_cost(0, 1000000, 700, 700, 0) - 1000000.0 / 700) < 1e-6);
    /* known: a batch alone leaves it */
    assert_true(thaw_sched_prompt_cost(1400.0, 1000000, 700, 700, 0) == 1400.0);
    /* a piece beside streams moves it: 36 prompt + 4 streams' tokens in 100 ms */
    double c = thaw_sched_prompt_cost(1400.0, 100000, 40, 36, 4);
    assert_true(c > 1400.0 && c < 2500.0);
    /* too few prompt tokens to tell */
    assert_true(thaw_sched_prompt_cost(1400.0, 100000, 10, 6, 4) == 1400.0);
}

static void test_batch_room(void **state)
{
    (void)state;
    /* nothing generating: the whole batch for a prompt */
    assert_int_equal(thaw_sched_batch_room(0, 2048, 512, 0), 2048);
    assert_int_equal(thaw_sched_batch_room(0, 2048, 512, 1e6), 2048);
    /* streams generating, the cost unknown or cheap: one micro-batch in all */
    assert_int_equal(thaw_sched_batch_room(3, 2048, 512, 0), 512);
    assert_int_equal(thaw_sched_batch_room(3, 2048, 512, 10.0), 512);
    /* costly tokens: what fits in THAW_STREAM_STEP_US, the streams' own included */
    assert_int_equal(thaw_sched_batch_room(4, 2048, 512, 1000.0), (int)(THAW_STREAM_STEP_US / 1000.0));
    /* never under THAW_PROMPT_CHUNK_MIN (nor over a micro-batch) */
    assert_int_equal(thaw_sched_batch_room(4, 2048, 512, 1e6), 4 + THAW_PROMPT_CHUNK_MIN);
    assert_int_equal(thaw_sched_batch_room(4, 2048, 16, 1e6), 4 + 16);
    /* the policy's numbers: a piece fits in 100 ms (at 2.5 ms a token, 40
     * tokens with 4 streams' own; 250 ms let steps with a piece make the
     * p99 gap between a stream's tokens 1.44x llama-server's, bench/vs-
     * llama-server), and never under 32 prompt tokens */
    assert_int_equal(thaw_sched_batch_room(4, 2048, 512, 2500.0), 40);
    assert_int_equal(thaw_sched_batch_room(4, 2048, 512, 1e6), 36);
    /* generation (drafts) filling a micro-batch: a prompt still advances */
    assert_int_equal(thaw_sched_batch_room(500, 2048, 512, 0), 500 + THAW_PROMPT_CHUNK_MIN);
    assert_int_equal(thaw_sched_batch_room(600, 2048, 512, 0), 600 + THAW_PROMPT_CHUNK_MIN);
    /* within the batch */
    assert_int_equal(thaw_sched_batch_room(2040, 2048, 512, 0), 2048);
    assert_int_equal(thaw_sched_batch_room(3, 256, 512, 0), 256);
}

static void test_fixup_budget(void **state)
{
    (void)state;
    /* a request waits for it: the whole batch */
    assert_int_equal(thaw_sched_fixup_room(1, 1, true, 1000.0, 512), 512);
    /* beside a prompt: nothing; beside generation: a few */
    assert_int_equal(thaw_sched_fixup_room(1, 0, false, 1000.0, 512), 0);
    assert_int_equal(thaw_sched_fixup_room(1, 3, false, 1000.0, 512), 0);
    assert_int_equal(thaw_sched_fixup_room(0, 2, false, 1000.0, 512), THAW_FIXUP_PIGGYBACK);
    /* alone: a slice of about THAW_FIXUP_SLICE_US, a small one while the
     * cost is unknown, within 1 .. n_batch */
    assert_int_equal(thaw_sched_fixup_room(0, 0, false, 0, 512), 4);
    assert_int_equal(thaw_sched_fixup_room(0, 0, false, 1000.0, 512), (int)(THAW_FIXUP_SLICE_US / 1000.0));
    assert_int_equal(thaw_sched_fixup_room(0, 0, false, 1e9, 512), 1);
    assert_int_equal(thaw_sched_fixup_room(0, 0, false, 1.0, 512), 512);
    /* due when it slows nobody, or once it has waited long enough */
    assert_true(thaw_sched_fixup_due(true, 0));
    assert_false(thaw_sched_fixup_due(false, THAW_FIXUP_DEFER_US - 1));
    assert_true(thaw_sched_fixup_due(false, THAW_FIXUP_DEFER_US));
    /* the cost: the first measurement, then a moving average; nothing
     * learnt from an empty or untimed batch */
    assert_true(thaw_sched_fixup_cost(0, 4000, 4) == 1000.0);
    assert_true(thaw_sched_fixup_cost(1000.0, 8000, 4) == 0.7 * 1000.0 + 0.3 * 2000.0);
    assert_true(thaw_sched_fixup_cost(1000.0, 0, 4) == 1000.0);
    assert_true(thaw_sched_fixup_cost(1000.0, 4000, 0) == 1000.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_bounded_fifo),
        cmocka_unit_test(test_free_fails_queued_tasks),
        cmocka_unit_test(test_pick_slot),
        cmocka_unit_test(test_admit_prefers_idle_unless_a_fixup_holds_more),
        cmocka_unit_test(test_admit_without_idle_cuts_or_waits),
        cmocka_unit_test(test_prompt_cost),
        cmocka_unit_test(test_batch_room),
        cmocka_unit_test(test_fixup_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
