/* test_budget.c — the reasoning budget stage (engine/budget.h), on a real
 * vocabulary (llama.cpp's llama-bpe vocab file, vocab only):
 *   - a block the generation prompt opens is counted from the first token;
 *     after `budget` tokens the message and end tag are forced, one token
 *     at a time (every other logit -inf), then the stage is done;
 *   - an end tag the model writes ends the block naturally (never forced),
 *     however the tokens split it; a new start tag re-arms the budget;
 *   - a prompt that opens and closes the block (thinking off) leaves
 *     nothing to force, even with budget 0; budget 0 otherwise forces at once;
 *   - a forced token the chain already forbids (a grammar) is not forced:
 *     the stage gives up and leaves the logits alone;
 *   - a clone carries the progress.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <llama.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/budget.h"
#include "fixture_models.h"

static char g_dir[] = "/tmp/thaw_budget_XXXXXX";
static struct llama_model *g_model;
static const struct llama_vocab *g_vocab;

static int group_setup(void **state)
{
    (void)state;
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    g_model = fixture_vocab_model("llama-bpe");
    g_vocab = g_model ? llama_model_get_vocab(g_model) : NULL;
    return g_vocab ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    llama_model_free(g_model);
    return fixture_llama_close(g_dir);
}

/* text's tokens (no BOS, special tokens parsed) into out; their count */
static int tok(const char *text, llama_token *out, int max)
{
    int n = llama_tokenize(g_vocab, text, (int32_t)strlen(text), out, max, false, true);
    assert_true(n > 0);
    return n;
}

static const char *const ENDS[] = {"</think>"};

/* A stage with budget b, the forced run " Enough.</think>" (in *forced). */
static struct llama_sampler *stage(int b, llama_token *forced, int *n_forced)
{
    *n_forced = tok(" Enough.</think>", forced, 16);
    struct thaw_budget_params p = {"<think>", ENDS, 1, forced, *n_forced, b};
    struct llama_sampler *s = thaw_budget_new(g_vocab, &p);
    assert_non_null(s);
    return s;
}

/* Applies the stage to a flat array of every token; returns the one
 * token left finite, -1 when several are (nothing forced). `banned`, if
 * >= 0, starts at -inf (a grammar that forbids it). */
static llama_token applied(struct llama_sampler *s, llama_token banned)
{
    int n = llama_vocab_n_tokens(g_vocab);
    llama_token_data *d = malloc((size_t)n * sizeof *d);
    llama_token_data_array cur = {d, (size_t)n, -1, false};
    llama_token only = -1;
    int finite = 0;

    for (int i = 0; i < n; i++)
        d[i] = (llama_token_data){i, i == banned ? -INFINITY : 0.0f, 0.0f};
    llama_sampler_apply(s, &cur);
    for (int i = 0; i < n; i++)
        if (d[i].logit != -INFINITY) {
            finite++;
            only = d[i].id;
        }
    free(d);
    return finite == 1 ? only : -1;
}

static void accept_text(struct llama_sampler *s, const char *text)
{
    llama_token t[64];
    int n = tok(text, t, 64);
    for (int i = 0; i < n; i++)
        llama_sampler_accept(s, t[i]);
}

static void counts_then_forces_the_message_and_end(void **state)
{
    (void)state;
    llama_token forced[16], word[4];
    int n_forced;
    struct llama_sampler *s = stage(5, forced, &n_forced);

    thaw_budget_feed(s, "<|Assistant|><think>\n");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_COUNTING);
    assert_int_equal(tok(" river", word, 4), 1);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(applied(s, -1), -1); /* nothing forced while counting */
        llama_sampler_accept(s, word[0]);
    }
    assert_int_equal(thaw_budget_n_thinking(s), 5);
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_FORCING);
    for (int i = 0; i < n_forced; i++) {
        assert_int_equal(applied(s, -1), forced[i]);
        llama_sampler_accept(s, forced[i]);
    }
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_DONE);
    assert_true(thaw_budget_forced(s));
    assert_int_equal(applied(s, -1), -1);
    accept_text(s, " and the content");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_DONE);
    llama_sampler_free(s);
}

static void a_written_end_tag_ends_the_block_and_a_start_rearms(void **state)
{
    (void)state;
    llama_token forced[16];
    int n_forced;
    struct llama_sampler *s = stage(8, forced, &n_forced);

    accept_text(s, "Sure. <think>");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_COUNTING);
    accept_text(s, " a b");
    accept_text(s, " c</think>\n\nAnswer");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_DONE);
    assert_false(thaw_budget_forced(s));
    int thought = thaw_budget_n_thinking(s);
    assert_true(thought >= 3 && thought < 8);
    /* a second block gets a fresh budget */
    accept_text(s, "<think>");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_COUNTING);
    llama_sampler_free(s);
}

static void thinking_off_leaves_nothing_to_force(void **state)
{
    (void)state;
    llama_token forced[16];
    int n_forced;
    struct llama_sampler *s = stage(0, forced, &n_forced);

    thaw_budget_feed(s, "<|Assistant|><think>\n</think>");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_DONE);
    assert_int_equal(applied(s, -1), -1);
    llama_sampler_free(s);

    s = stage(0, forced, &n_forced); /* a block the prompt leaves open: ended at once */
    thaw_budget_feed(s, "<|Assistant|><think>\n");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_FORCING);
    assert_int_equal(applied(s, -1), forced[0]);
    llama_sampler_free(s);
}

static void never_forces_what_the_chain_forbids(void **state)
{
    (void)state;
    llama_token forced[16];
    int n_forced;
    struct llama_sampler *s = stage(0, forced, &n_forced);

    thaw_budget_feed(s, "<think>");
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_FORCING);
    assert_int_equal(applied(s, forced[0]), -1); /* left alone: every token but the banned one stays */
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_DONE);
    llama_sampler_free(s);
}

static void a_clone_carries_the_progress(void **state)
{
    (void)state;
    llama_token forced[16], word[4];
    int n_forced;
    struct llama_sampler *s = stage(3, forced, &n_forced);

    thaw_budget_feed(s, "<think>");
    tok(" river", word, 4);
    llama_sampler_accept(s, word[0]);
    llama_sampler_accept(s, word[0]);
    struct llama_sampler *c = llama_sampler_clone(s);
    assert_non_null(c);
    assert_true(thaw_budget_is(c));
    llama_sampler_accept(c, word[0]);
    assert_int_equal(thaw_budget_state(c), THAW_BUDGET_FORCING);
    assert_int_equal(thaw_budget_state(s), THAW_BUDGET_COUNTING);
    llama_sampler_free(c);
    llama_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counts_then_forces_the_message_and_end),
        cmocka_unit_test(a_written_end_tag_ends_the_block_and_a_start_rearms),
        cmocka_unit_test(thinking_off_leaves_nothing_to_force),
        cmocka_unit_test(never_forces_what_the_chain_forbids),
        cmocka_unit_test(a_clone_carries_the_progress),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
