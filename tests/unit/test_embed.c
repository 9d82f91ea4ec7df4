/* test_embed.c — --embd-normalize's norms (engine/embed.h), and an
 * embedding task's hand-off (task.h): its request asks for any slot and
 * no cache, and its vectors move into it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "engine/embed.h"
#include "engine/task.h"

static const float v[4] = {3.0f, -4.0f, 0.0f, 12.0f};

static void test_norms(void **state)
{
    float out[4];

    (void)state;
    thaw_embd_normalize(v, out, 4, 2); /* euclidean: |v| = 13 */
    assert_float_equal(out[0], 3.0f / 13, 1e-7);
    assert_float_equal(out[1], -4.0f / 13, 1e-7);
    assert_float_equal(out[3], 12.0f / 13, 1e-7);
    thaw_embd_normalize(v, out, 4, 1); /* taxicab: sum |x| = 19 */
    assert_float_equal(out[3], 12.0f / 19, 1e-7);
    thaw_embd_normalize(v, out, 4, 0); /* max abs -> 32760 */
    assert_float_equal(out[3], 32760.0f, 1e-2);
    assert_float_equal(out[0], 3.0f * 32760 / 12, 1e-2);
    thaw_embd_normalize(v, out, 4, -1); /* none */
    for (int i = 0; i < 4; i++)
        assert_float_equal(out[i], v[i], 0);
    thaw_embd_normalize(v, out, 4, 3); /* p-norm: sum |x|^3 = 1 afterwards */
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += pow(fabs(out[i]), 3);
    assert_float_equal(s, 1.0, 1e-6);
    thaw_embd_normalize(v, out, 4, -5); /* below -1: none */
    assert_float_equal(out[1], -4.0f, 0);
}

static void test_zero_and_in_place(void **state)
{
    float z[3] = {0, 0, 0}, w[2] = {6.0f, 8.0f};

    (void)state;
    thaw_embd_normalize(z, z, 3, 2); /* a zero vector stays zero, no NaN */
    for (int i = 0; i < 3; i++)
        assert_float_equal(z[i], 0.0f, 0);
    thaw_embd_normalize(w, w, 2, 2);
    assert_float_equal(w[0], 0.6f, 1e-7);
    assert_float_equal(w[1], 0.8f, 1e-7);
}

static void test_embed_task(void **state)
{
    llama_token *prompt = malloc(3 * sizeof *prompt);
    float *vec = malloc(2 * sizeof *vec);

    (void)state;
    assert_non_null(prompt);
    assert_non_null(vec);
    struct thaw_task *t = thaw_task_new_embed(THAW_TASK_RERANK, prompt, 3, 1);
    assert_non_null(t);
    assert_int_equal(t->kind, THAW_TASK_RERANK);
    assert_int_equal(t->embd_normalize, 1);
    assert_int_equal(t->req.id_slot, -1); /* any slot */
    assert_false(t->req.cache_prompt);
    assert_false(thaw_task_done(t));
    vec[0] = 0.25f;
    vec[1] = 0.75f;
    thaw_task_finish_embd(t, vec, 1, 2);
    assert_true(thaw_task_done(t));
    assert_int_equal(t->http_status, 200);
    assert_int_equal(t->n_embd_rows, 1);
    assert_int_equal(t->n_embd, 2);
    assert_float_equal(t->embd[0], 0.25f, 0);
    float *late = malloc(sizeof *late); /* a second answer is dropped (and freed) */
    thaw_task_finish_embd(t, late, 1, 1);
    assert_int_equal(t->n_embd, 2);
    thaw_task_release(t); /* frees the prompt and the vectors */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_zero_and_in_place),
        cmocka_unit_test(test_embed_task),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
