/* test_scheduler.c — the bounded queue and slot choice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "scheduler.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_bounded_fifo),
        cmocka_unit_test(test_free_fails_queued_tasks),
        cmocka_unit_test(test_pick_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
