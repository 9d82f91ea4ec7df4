/* test_slot.c — the slot's transition table, what each move does (task,
 * fix-up tokens, busy gauge), what the KV holds, and the reply's text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/slot.h"

#include <stdlib.h>

static struct thaw_task *task(void)
{
    struct thaw_chat_request req;

    memset(&req, 0, sizeof req);
    return thaw_task_new(&req, NULL, 0);
}

/* Moves the slot to `to`, with a fresh task when that is PREFILL. */
static void move(struct thaw_slot *s, enum thaw_slot_phase to, struct thaw_metrics *m)
{
    struct thaw_slot_enter in = {.task = to == THAW_SLOT_PREFILL ? task() : NULL};

    thaw_slot_move(s, to, &in, m);
}

#define I THAW_SLOT_IDLE
#define P THAW_SLOT_PREFILL
#define G THAW_SLOT_GEN
#define F THAW_SLOT_FIXUP

/* The table of slot.h, written out again: a change to either must be a
 * deliberate change to both. */
static void test_table_is_exactly_the_documented_moves(void **state)
{
    static const bool want[4][4] = {
        /*         I      P      G      F  */
        [I] = {false, true, false, false},
        [P] = {true, false, true, true},
        [G] = {true, false, false, true},
        [F] = {true, false, false, false},
    };

    (void)state;
    for (int from = 0; from < THAW_SLOT_PHASE_COUNT; from++)
        for (int to = 0; to < THAW_SLOT_PHASE_COUNT; to++)
            assert_int_equal(thaw_slot_move_legal((enum thaw_slot_phase)from, (enum thaw_slot_phase)to),
                             want[from][to]);
    assert_false(thaw_slot_move_legal(THAW_SLOT_PHASE_COUNT, THAW_SLOT_IDLE));
    assert_false(thaw_slot_move_legal(THAW_SLOT_IDLE, THAW_SLOT_PHASE_COUNT));
}

/* Every path through the table keeps slots_busy == the number of slots
 * not IDLE, and requests_processing == those in PREFILL or GEN. */
static void test_busy_gauge_follows_every_path(void **state)
{
    static const enum thaw_slot_phase paths[][5] = {
        {P, G, I},    /* a plain reply */
        {P, G, F, I}, /* a reply whose canonical form is re-decoded */
        {P, F, I},    /* EOG as the first token, then FIXUP */
        {P, I},       /* failed or cancelled during prefill */
        {P, G, I},    /* cancelled mid-generation */
    };
    struct thaw_metrics m;
    struct thaw_slot a, b;

    (void)state;
    memset(&m, 0, sizeof m);
    thaw_slot_init(&a, 0);
    thaw_slot_init(&b, 1);
    assert_int_equal(a.phase, THAW_SLOT_IDLE);
    assert_int_equal(a.i_batch, -1);
    move(&b, THAW_SLOT_PREFILL, &m); /* another slot stays busy throughout */
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
        for (int i = 0; i < 5; i++) { /* each path ends back in IDLE */
            move(&a, paths[k][i], &m);
            assert_int_equal(a.phase, paths[k][i]);
            assert_int_equal(atomic_load(&m.slots_busy), 1 + (a.phase != THAW_SLOT_IDLE));
            /* a request in flight: PREFILL or GEN, the re-decode after it not */
            assert_int_equal(atomic_load(&m.requests_processing),
                             1 + (a.phase == THAW_SLOT_PREFILL || a.phase == THAW_SLOT_GEN));
            if (a.phase == THAW_SLOT_IDLE)
                break;
        }
    }
    move(&b, THAW_SLOT_IDLE, &m);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    assert_int_equal(atomic_load(&m.requests_processing), 0);
    move(&a, THAW_SLOT_PREFILL, NULL); /* no metrics: the phase still moves */
    assert_int_equal(a.phase, THAW_SLOT_PREFILL);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    move(&a, THAW_SLOT_IDLE, NULL);
    thaw_slot_free(&a);
    thaw_slot_free(&b);
}

static void test_gen_append_keeps_text_terminated(void **state)
{
    struct thaw_slot s;

    (void)state;
    thaw_slot_init(&s, 0);
    assert_int_equal(thaw_slot_gen_append(&s, "hello", 5), 0);
    for (int i = 0; i < 200; i++)
        assert_int_equal(thaw_slot_gen_append(&s, " world", 6), 0);
    assert_int_equal(s.gen.len, 5 + 200 * 6);
    assert_int_equal(strlen(s.gen.data), s.gen.len);
    assert_memory_equal(s.gen.data, "hello world", 11);
    assert_int_equal(thaw_slot_reserve(&s, 1000), 0);
    assert_true(s.cap_tokens >= 1000);
    thaw_slot_free(&s);
    assert_null(s.gen.data);
    assert_null(s.tokens);
}


/* Entering PREFILL takes the task and starts the request afresh; leaving
 * it for IDLE or FIXUP gives the task back (the slot's reference goes). */
static void test_prefill_takes_the_task_and_idle_releases_it(void **state)
{
    struct thaw_metrics m;
    struct thaw_slot s;
    struct thaw_task *t = task();
    uint8_t key[THAW_KEY_BYTES];

    (void)state;
    memset(&m, 0, sizeof m);
    memset(key, 7, sizeof key);
    t->req.stop[0] = strdup("</s>"); /* the task frees them */
    t->req.stop[1] = strdup("STOP!");
    t->req.n_stop = 2;
    t->has_lookup_key = true;
    memcpy(t->lookup_key, key, sizeof key);
    thaw_slot_init(&s, 0);
    s.gen.len = s.n_sent = 9;
    s.n_decoded = 3;
    s.timings.cache_n = 5;
    thaw_task_retain(t); /* ours, to look at it after the slot lets go */
    thaw_slot_move(&s, THAW_SLOT_PREFILL, &(struct thaw_slot_enter){.task = t}, &m);
    assert_ptr_equal(s.task, t);
    assert_int_equal(s.gen.len, 0);
    assert_int_equal(s.n_sent, 0);
    assert_int_equal(s.n_decoded, 0);
    assert_int_equal(s.timings.cache_n, 0);
    assert_string_equal(s.timings.cache_source, "none");
    assert_int_equal(s.stop_hold, 4); /* "STOP!" - 1 */
    assert_true(s.has_prev_key);
    assert_memory_equal(s.prev_key, key, sizeof key);
    assert_int_equal(atomic_load(&t->refs), 2);
    s.last_used_us = 0;
    thaw_slot_move(&s, THAW_SLOT_GEN, NULL, &m);
    assert_ptr_equal(s.task, t); /* GEN still serves it */
    thaw_slot_move(&s, THAW_SLOT_IDLE, NULL, &m);
    assert_null(s.task);
    assert_null(s.smpl);
    assert_int_equal(s.i_batch, -1);
    assert_true(s.last_used_us > 0);
    assert_int_equal(atomic_load(&t->refs), 1);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    thaw_task_release(t);
    thaw_slot_free(&s);
}

/* FIXUP owns its tokens from the move in to the move out, whichever way
 * it leaves (stored, cut short, failed): nothing leaks, nothing stale is
 * left for the next FIXUP. */
static void test_fixup_takes_and_frees_its_tokens(void **state)
{
    struct thaw_metrics m;
    struct thaw_slot s;

    (void)state;
    memset(&m, 0, sizeof m);
    thaw_slot_init(&s, 0);
    assert_int_equal(thaw_slot_reserve(&s, 8), 0);
    s.n_tokens = 6;
    move(&s, THAW_SLOT_PREFILL, &m);
    move(&s, THAW_SLOT_GEN, &m);
    llama_token *fix = malloc(9 * sizeof *fix);
    assert_non_null(fix);
    thaw_slot_move(&s, THAW_SLOT_FIXUP, &(struct thaw_slot_enter){.fix = fix, .n_fix = 9}, &m);
    assert_null(s.task); /* the reply is out: the task is released */
    assert_ptr_equal(s.fix, fix);
    assert_int_equal(s.n_fix, 9);
    assert_true(s.fix_since_us > 0);
    assert_int_equal(atomic_load(&m.slots_busy), 1); /* busy until stored */
    thaw_slot_move(&s, THAW_SLOT_IDLE, NULL, &m);
    assert_null(s.fix);
    assert_int_equal(s.n_fix, 0);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    /* straight from PREFILL (EOG first), nothing to re-decode: store as is */
    move(&s, THAW_SLOT_PREFILL, &m);
    thaw_slot_move(&s, THAW_SLOT_FIXUP, NULL, &m);
    assert_null(s.fix);
    assert_int_equal(s.n_fix, 6);
    move(&s, THAW_SLOT_IDLE, &m);
    assert_int_equal(s.n_fix, 0);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    thaw_slot_free(&s);
}

/* The key names the conversation in the KV only while the KV holds all of
 * it: forgetting or cutting the sequence drops it. */
static void test_held_key_follows_the_kv(void **state)
{
    struct thaw_slot s;
    uint8_t k1[THAW_KEY_BYTES], k2[THAW_KEY_BYTES];

    (void)state;
    memset(k1, 1, sizeof k1);
    memset(k2, 2, sizeof k2);
    thaw_slot_init(&s, 0);
    assert_false(thaw_slot_holds(&s, k1));
    assert_int_equal(thaw_slot_reserve(&s, 16), 0);
    s.n_tokens = 10;
    thaw_slot_hold(&s, k1);
    assert_true(thaw_slot_holds(&s, k1));
    assert_false(thaw_slot_holds(&s, k2));
    thaw_slot_truncate(&s, 10); /* nothing cut: still the whole conversation */
    assert_true(thaw_slot_holds(&s, k1));
    thaw_slot_truncate(&s, 7);
    assert_int_equal(s.n_tokens, 7);
    assert_false(thaw_slot_holds(&s, k1));
    thaw_slot_hold(&s, k2);
    thaw_slot_forget(&s);
    assert_int_equal(s.n_tokens, 0);
    assert_false(thaw_slot_holds(&s, k2));
    thaw_slot_hold(&s, k1);
    thaw_slot_hold(&s, NULL);
    assert_false(thaw_slot_holds(&s, k1));
    thaw_slot_free(&s);
}

static void test_count_by_phase(void **state)
{
    struct thaw_slot v[5];
    int count[THAW_SLOT_PHASE_COUNT];

    (void)state;
    for (int i = 0; i < 5; i++)
        thaw_slot_init(&v[i], i);
    move(&v[1], THAW_SLOT_PREFILL, NULL);
    move(&v[2], THAW_SLOT_PREFILL, NULL);
    move(&v[2], THAW_SLOT_GEN, NULL);
    move(&v[3], THAW_SLOT_PREFILL, NULL);
    move(&v[3], THAW_SLOT_FIXUP, NULL);
    thaw_slot_count(v, 5, count);
    assert_int_equal(count[THAW_SLOT_IDLE], 2);
    assert_int_equal(count[THAW_SLOT_PREFILL], 1);
    assert_int_equal(count[THAW_SLOT_GEN], 1);
    assert_int_equal(count[THAW_SLOT_FIXUP], 1);
    thaw_slot_count(v, 0, count);
    assert_int_equal(count[THAW_SLOT_IDLE], 0);
    move(&v[1], THAW_SLOT_IDLE, NULL);
    move(&v[2], THAW_SLOT_IDLE, NULL);
    move(&v[3], THAW_SLOT_IDLE, NULL);
    for (int i = 0; i < 5; i++)
        thaw_slot_free(&v[i]);
}

/* Streaming holds back what a stop string or a split UTF-8 character may
 * still change; the final flush sends the rest. */
static void test_flush_holds_back_a_possible_stop(void **state)
{
    struct thaw_slot s;
    struct thaw_task *t = task();

    (void)state;
    t->req.stop[0] = strdup("END");
    t->req.n_stop = 1;
    thaw_task_retain(t);
    thaw_slot_init(&s, 0);
    thaw_slot_move(&s, THAW_SLOT_PREFILL, &(struct thaw_slot_enter){.task = t}, NULL);
    assert_int_equal(thaw_slot_gen_append(&s, "hello E", 7), 0);
    thaw_slot_flush_text(&s, false);
    assert_int_equal(t->text.len, 5); /* "hello", not " E": it may begin "END" */
    assert_null(thaw_slot_find_stop(&s, 0, NULL));
    assert_int_equal(thaw_slot_gen_append(&s, "\xc3", 1), 0); /* half of a 2-byte character */
    thaw_slot_flush_text(&s, false);
    assert_int_equal(t->text.len, 6);
    assert_int_equal(thaw_slot_gen_append(&s, "\xa9", 1), 0);
    assert_null(thaw_slot_find_stop(&s, 8, NULL));
    assert_int_equal(thaw_slot_gen_append(&s, "END", 3), 0);
    int which = -1;
    const char *hit = thaw_slot_find_stop(&s, 9, &which);
    assert_non_null(hit);
    assert_int_equal(which, 0);
    assert_int_equal(hit - s.gen.data, 9);
    thaw_slot_flush_text(&s, true);
    assert_int_equal(t->text.len, s.gen.len);
    thaw_slot_move(&s, THAW_SLOT_IDLE, NULL, NULL);
    thaw_task_release(t);
    thaw_slot_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_exactly_the_documented_moves),
        cmocka_unit_test(test_busy_gauge_follows_every_path),
        cmocka_unit_test(test_gen_append_keeps_text_terminated),
        cmocka_unit_test(test_prefill_takes_the_task_and_idle_releases_it),
        cmocka_unit_test(test_fixup_takes_and_frees_its_tokens),
        cmocka_unit_test(test_held_key_follows_the_kv),
        cmocka_unit_test(test_count_by_phase),
        cmocka_unit_test(test_flush_holds_back_a_possible_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
