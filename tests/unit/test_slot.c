/* test_slot.c — the slot's transition table and the busy gauge it keeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "slot.h"

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
 * not IDLE. */
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
    thaw_slot_set_phase(&b, THAW_SLOT_PREFILL, &m); /* another slot stays busy throughout */
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
        for (int i = 0; i < 5; i++) { /* each path ends back in IDLE */
            thaw_slot_set_phase(&a, paths[k][i], &m);
            assert_int_equal(a.phase, paths[k][i]);
            assert_int_equal(atomic_load(&m.slots_busy), 1 + (a.phase != THAW_SLOT_IDLE));
            if (a.phase == THAW_SLOT_IDLE)
                break;
        }
    }
    thaw_slot_set_phase(&b, THAW_SLOT_IDLE, &m);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
    thaw_slot_set_phase(&a, THAW_SLOT_PREFILL, NULL); /* no metrics: the phase still moves */
    assert_int_equal(a.phase, THAW_SLOT_PREFILL);
    assert_int_equal(atomic_load(&m.slots_busy), 0);
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
    assert_int_equal(s.n_gen, 5 + 200 * 6);
    assert_int_equal(strlen(s.gen), s.n_gen);
    assert_memory_equal(s.gen, "hello world", 11);
    assert_int_equal(thaw_slot_reserve(&s, 1000), 0);
    assert_true(s.cap_tokens >= 1000);
    thaw_slot_free(&s);
    assert_null(s.gen);
    assert_null(s.tokens);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_exactly_the_documented_moves),
        cmocka_unit_test(test_busy_gauge_follows_every_path),
        cmocka_unit_test(test_gen_append_keeps_text_terminated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
