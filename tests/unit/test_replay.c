/* test_replay.c — the replay sessions' table (http/replay.h), without a
 * connection: invariant 1 (a new session under an id cancels the one
 * before), 2 (the cap: the oldest bytes go, an offset before them is
 * lost), what the lookup tells and what it does not, and the readers'
 * refusals (tests/e2e/test_resumable_streams.py reads them over HTTP). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "http/replay.h"

/* The lookup's answer for one id, parsed: its entries (a new reference). */
static json_t *lookup(const char *id)
{
    const char *ids[] = {id};
    char *s = thaw_replay_lookup_json(ids, 1);
    json_t *a = json_loads(s, 0, NULL);

    free(s);
    assert_true(json_is_array(a));
    return a;
}

static json_int_t total_bytes(const char *id)
{
    json_t *a = lookup(id);
    assert_int_equal(json_array_size(a), 1);
    json_int_t n = json_integer_value(json_object_get(json_array_get(a, 0), "total_bytes"));
    json_decref(a);
    return n;
}

static void test_a_new_session_cancels_the_one_before(void **state)
{
    (void)state;
    struct thaw_replay *a = thaw_replay_open("conv", false);
    assert_non_null(a);
    thaw_replay_append(a, "data: 1\n\n", 9);
    struct thaw_replay *b = thaw_replay_open("conv", false);
    assert_true(thaw_replay_cancelled(a));
    assert_false(thaw_replay_cancelled(b));
    assert_int_equal(total_bytes("conv"), 0); /* the new one's */
    thaw_replay_append(a, "late", 4);         /* the old producer writes on: nowhere */
    assert_int_equal(total_bytes("conv"), 0);
    thaw_replay_unref(a);
    assert_true(thaw_replay_cancel("conv"));
    assert_true(thaw_replay_cancelled(b));
    assert_false(thaw_replay_cancel("conv"));
    thaw_replay_unref(b);
}

static void test_the_cap_drops_the_oldest_bytes(void **state)
{
    (void)state;
    struct thaw_replay *r = thaw_replay_open("big", false);
    size_t chunk = 1u << 20;
    char *bytes = malloc(chunk);
    memset(bytes, 'x', chunk);
    for (int i = 0; i < 6; i++)
        thaw_replay_append(r, bytes, chunk);
    assert_int_equal(total_bytes("big"), 6 * (json_int_t)chunk); /* every byte counted */
    struct thaw_replay_reader *rd = NULL;
    /* an offset before the bytes kept is lost; one inside them is not (the
     * error cases return before they touch the connection) */
    assert_int_equal(thaw_replay_reader_new("big", chunk, NULL, &rd), THAW_EINVAL);
    assert_null(rd);
    assert_int_equal(thaw_replay_reader_new("nobody", 0, NULL, &rd), THAW_ENOTFOUND);
    free(bytes);
    thaw_replay_finish(r);
    thaw_replay_unref(r);
    thaw_replay_shutdown();
    json_t *a = lookup("big");
    assert_int_equal(json_array_size(a), 0);
    json_decref(a);
}

static void test_loading_and_abort(void **state)
{
    (void)state;
    struct thaw_replay_reader *rd = NULL;
    struct thaw_replay *r = thaw_replay_open("wait", true);
    assert_int_equal(thaw_replay_reader_new("wait", 0, NULL, &rd), THAW_EBUSY); /* its model loads */
    thaw_replay_abort(r); /* no stream took it: forgotten */
    assert_int_equal(thaw_replay_reader_new("wait", 0, NULL, &rd), THAW_ENOTFOUND);
    thaw_replay_unref(r);

    r = thaw_replay_open("wait", true);
    thaw_replay_loaded(r); /* a stream took it: an abort leaves it */
    thaw_replay_abort(r);
    assert_int_equal(total_bytes("wait"), 0);
    thaw_replay_forget(r);
    thaw_replay_unref(r);
}

static void test_lookup_names_only_what_it_is_asked(void **state)
{
    (void)state;
    struct thaw_replay *a = thaw_replay_open("chat-7::org/model:Q8", false);
    struct thaw_replay *b = thaw_replay_open("chat-70", false);
    thaw_replay_append(a, "abc", 3);
    thaw_replay_finish(a);
    json_t *got = lookup("chat-7"); /* the id and its per-model variants, not chat-70 */
    assert_int_equal(json_array_size(got), 1);
    json_t *e = json_array_get(got, 0);
    assert_string_equal(json_string_value(json_object_get(e, "conversation_id")), "chat-7::org/model:Q8");
    assert_true(json_is_true(json_object_get(e, "is_done")));
    assert_int_equal(json_integer_value(json_object_get(e, "total_bytes")), 3);
    assert_true(json_integer_value(json_object_get(e, "completed_at")) > 0);
    json_decref(got);
    got = lookup("");
    assert_int_equal(json_array_size(got), 0); /* nothing is listed unasked */
    json_decref(got);
    assert_null(thaw_replay_open("", false));
    thaw_replay_unref(a);
    thaw_replay_unref(b);
    thaw_replay_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_new_session_cancels_the_one_before),
        cmocka_unit_test(test_the_cap_drops_the_oldest_bytes),
        cmocka_unit_test(test_loading_and_abort),
        cmocka_unit_test(test_lookup_names_only_what_it_is_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
