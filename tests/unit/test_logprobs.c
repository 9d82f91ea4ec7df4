/* test_logprobs.c — the per-token probability list: which entries go with
 * which text (a stream and a whole reply send the same ones) and the JSON
 * shapes (llama-server's entries, OpenAI completions' legacy object). */
#include "api/logprobs.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void add(struct thaw_logprobs *lp, int32_t tok, const char *piece, float p, uint32_t start)
{
    struct thaw_logprob_in s = {tok, p, piece, strlen(piece)};
    struct thaw_logprob_in top[2] = {{tok, p, piece, strlen(piece)}, {99, p / 2, "\xe2\x82", 2}};
    assert_int_equal(thaw_logprobs_add(lp, &s, top, 2, start, start + (uint32_t)strlen(piece)), 0);
}

/* reply "ab" "cd" "ef": a stop string cut the text to "abc" */
static void test_which_entries(void **state)
{
    struct thaw_logprobs lp = {0};

    (void)state;
    add(&lp, 1, "ab", 0.5f, 0);
    add(&lp, 2, "cd", 0.25f, 2);
    add(&lp, 3, "ef", 1.0f, 4);
    /* streaming: only entries whose last byte is out */
    assert_int_equal(thaw_logprobs_upto(&lp, 0, 1, false), 0);
    assert_int_equal(thaw_logprobs_upto(&lp, 0, 3, false), 1);
    assert_int_equal(thaw_logprobs_upto(&lp, 0, 4, false), 2);
    /* done at "abc": "cd" contributed a byte and stays, "ef" goes */
    assert_int_equal(thaw_logprobs_upto(&lp, 0, 3, true), 2);
    assert_int_equal(thaw_logprobs_upto(&lp, 1, 3, true), 2);
    assert_int_equal(thaw_logprobs_upto(&lp, 0, 6, true), 3);
    thaw_logprobs_free(&lp);
    assert_int_equal(lp.n, 0);
}

static void test_json_shapes(void **state)
{
    struct thaw_logprobs lp = {0};

    (void)state;
    add(&lp, 7, "hi", 0.5f, 0);
    add(&lp, 8, " x", 0.0f, 2);
    json_t *a = thaw_logprobs_json(&lp, 0, 2, false, false);
    assert_int_equal(json_array_size(a), 2);
    json_t *e = json_array_get(a, 0);
    assert_int_equal(json_integer_value(json_object_get(e, "id")), 7);
    assert_string_equal(json_string_value(json_object_get(e, "token")), "hi");
    assert_int_equal(json_array_size(json_object_get(e, "bytes")), 2);
    assert_true(fabs(json_real_value(json_object_get(e, "logprob")) - log(0.5)) < 1e-6);
    json_t *top = json_object_get(e, "top_logprobs");
    assert_int_equal(json_array_size(top), 2);
    /* a piece cut inside a character: "token" stops before it, "bytes" has all */
    assert_string_equal(json_string_value(json_object_get(json_array_get(top, 1), "token")), "");
    assert_int_equal(json_array_size(json_object_get(json_array_get(top, 1), "bytes")), 2);
    /* p == 0: JSON has no -inf; llama-server writes the lowest float */
    assert_true(json_real_value(json_object_get(json_array_get(a, 1), "logprob")) < -1e30);
    json_decref(a);

    json_t *post = thaw_logprobs_json(&lp, 0, 1, true, false);
    e = json_array_get(post, 0);
    assert_true(json_real_value(json_object_get(e, "prob")) == 0.5);
    assert_non_null(json_object_get(e, "top_probs"));
    assert_null(json_object_get(e, "logprob"));
    json_decref(post);

    json_t *legacy = thaw_logprobs_json(&lp, 0, 2, false, true);
    assert_int_equal(json_array_size(json_object_get(legacy, "content")), 2);
    assert_string_equal(json_string_value(json_array_get(json_object_get(legacy, "tokens"), 1)), " x");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(legacy, "text_offset"), 1)), 2);
    assert_true(json_is_object(json_array_get(json_object_get(legacy, "top_logprobs"), 0)));
    assert_non_null(json_object_get(json_array_get(json_object_get(legacy, "top_logprobs"), 0), "hi"));
    json_decref(legacy);
    thaw_logprobs_free(&lp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_which_entries),
        cmocka_unit_test(test_json_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
