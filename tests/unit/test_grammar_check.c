/* test_grammar_check.c — the grammar asked about the best candidates first
 * (engine/grammar_check.h), on a real vocabulary (llama.cpp's llama-bpe,
 * 128k tokens, vocab only), against the grammar-first chain it replaces:
 *   - the same pick, token after token, on random logits, for a character
 *     class, an alternation, a JSON-ish grammar and a token-literal one;
 *   - a best candidate the grammar allows is decided alone: the stage
 *     leaves that one token (the whole vocabulary is never asked about);
 *   - an allowed token at rank ~500 is found in the 1024-candidate group;
 *   - when none of the best 1024 is allowed, the whole array is asked, as
 *     the grammar-first chain does (every refused token at -inf);
 *   - ties go to the lower id, as the greedy scan's do;
 *   - a clone carries the grammar's progress;
 *   - a sampled pick (temperature + dist) draws only what the grammar
 *     allows, with the grammar-first chain's distribution (rejection
 *     sampling: a refused draw is redrawn from the allowed tokens), and a
 *     draw the grammar allows is kept as drawn.
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

#include "engine/grammar_check.h"
#include "fixture_models.h"

static char g_dir[] = "/tmp/thaw_gg_XXXXXX";
static struct llama_model *g_model;
static const struct llama_vocab *g_vocab;
static int g_n;
static llama_token_data *g_a, *g_b;

static int group_setup(void **state)
{
    (void)state;
    if (fixture_llama_open(g_dir) != 0)
        return -1;
    g_model = fixture_vocab_model("llama-bpe");
    g_vocab = g_model ? llama_model_get_vocab(g_model) : NULL;
    if (!g_vocab)
        return -1;
    g_n = llama_vocab_n_tokens(g_vocab);
    g_a = malloc((size_t)g_n * sizeof *g_a);
    g_b = malloc((size_t)g_n * sizeof *g_b);
    return g_a && g_b ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    free(g_a);
    free(g_b);
    llama_model_free(g_model);
    return fixture_llama_close(g_dir);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float uniform(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)(g_rng >> 40) / (float)(1u << 24);
}

static void random_logits(llama_token_data *d)
{
    for (int i = 0; i < g_n; i++)
        d[i] = (llama_token_data){i, 10.0f * uniform() - 5.0f, 0.0f};
}

/* grammar first, then the greedy pick: the chain the stage replaces */
static struct llama_sampler *reference(const char *gbnf)
{
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    struct llama_sampler *g = llama_sampler_init_grammar(g_vocab, gbnf, "root");
    assert_non_null(g);
    llama_sampler_chain_add(c, g);
    llama_sampler_chain_add(c, llama_sampler_init_greedy());
    return c;
}

static struct llama_sampler *staged(const char *gbnf)
{
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    struct llama_sampler *g = thaw_grammar_greedy_new(llama_sampler_init_grammar(g_vocab, gbnf, "root"));
    assert_non_null(g);
    llama_sampler_chain_add(c, g);
    llama_sampler_chain_add(c, llama_sampler_init_greedy());
    return c;
}

/* Applies s to a copy of d (n candidates) in buf; the pick, or -1. *left:
 * the candidates the array holds afterwards. */
static llama_token pick(struct llama_sampler *s, const llama_token_data *d, llama_token_data *buf, size_t *left)
{
    llama_token_data_array cur = {buf, (size_t)g_n, -1, false};

    memcpy(buf, d, (size_t)g_n * sizeof *buf);
    llama_sampler_apply(s, &cur);
    *left = cur.size;
    return cur.selected >= 0 ? cur.data[cur.selected].id : -1;
}

static void same_pick_as_grammar_first(const char *gbnf, int steps)
{
    struct llama_sampler *ref = reference(gbnf), *fast = staged(gbnf);
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    for (int i = 0; i < steps; i++) {
        random_logits(d);
        llama_token want = pick(ref, d, g_a, &left);
        llama_token got = pick(fast, d, g_b, &left);
        assert_true(want >= 0);
        assert_int_equal(got, want);
        if (llama_vocab_is_eog(g_vocab, want))
            break;
        llama_sampler_accept(ref, want);
        llama_sampler_accept(fast, got);
    }
    free(d);
    llama_sampler_free(ref);
    llama_sampler_free(fast);
}

static void same_picks_on_random_logits(void **state)
{
    (void)state;
    same_pick_as_grammar_first("root ::= [a-z ]+", 24);
    same_pick_as_grammar_first("root ::= \"yes\" | \"no\" | \"maybe so\"", 8);
    same_pick_as_grammar_first("root ::= \"{\" ws \"\\\"n\\\":\" ws [0-9]+ ws \"}\"\nws ::= [ \\t\\n]*", 24);
    same_pick_as_grammar_first("root ::= <[1000]> <[2000]> <[3000]> <[4000]>", 6);
}

static void an_allowed_best_candidate_is_decided_alone(void **state)
{
    (void)state;
    llama_token t[4];
    assert_int_equal(llama_tokenize(g_vocab, "river", 5, t, 4, false, false), 1);
    struct llama_sampler *s = staged("root ::= [a-z]+");
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    random_logits(d);
    d[t[0]].logit = 100.0f;
    assert_int_equal(pick(s, d, g_b, &left), t[0]);
    assert_int_equal(left, 1);
    free(d);
    llama_sampler_free(s);
}

static void an_allowed_token_near_rank_500_is_found_among_the_best_1024(void **state)
{
    (void)state;
    struct llama_sampler *s = staged("root ::= <[4242]>"), *ref = reference("root ::= <[4242]>");
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    random_logits(d);
    for (int i = 0; i < 600; i++)
        d[(i * 97 + 11) % g_n].logit = 50.0f + (float)i; /* 600 better than the rest */
    d[4242].logit = 50.0f + 100.5f;                     /* rank ~500 */
    assert_int_equal(pick(s, d, g_b, &left), 4242);
    assert_int_equal(left, 1);
    assert_int_equal(pick(ref, d, g_a, &left), 4242);
    free(d);
    llama_sampler_free(s);
    llama_sampler_free(ref);
}

static void none_of_the_best_allowed_asks_the_whole_array(void **state)
{
    (void)state;
    struct llama_sampler *s = staged("root ::= <[4242]>");
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    random_logits(d);
    d[4242].logit = -1000.0f; /* the last of all */
    assert_int_equal(pick(s, d, g_b, &left), 4242);
    assert_int_equal(left, (size_t)g_n);
    int finite = 0;
    for (int i = 0; i < g_n; i++)
        finite += isfinite(g_b[i].logit);
    assert_int_equal(finite, 1);
    free(d);
    llama_sampler_free(s);
}

static void ties_go_to_the_lower_id(void **state)
{
    (void)state;
    struct llama_sampler *s = staged("root ::= [a-z]+"), *ref = reference("root ::= [a-z]+");
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    for (int i = 0; i < g_n; i++)
        d[i] = (llama_token_data){i, 1.0f, 0.0f};
    llama_token want = pick(ref, d, g_a, &left);
    assert_int_equal(pick(s, d, g_b, &left), want);
    free(d);
    llama_sampler_free(s);
    llama_sampler_free(ref);
}

static void a_clone_carries_the_progress(void **state)
{
    (void)state;
    struct llama_sampler *s = thaw_grammar_greedy_new(llama_sampler_init_grammar(g_vocab, "root ::= <[7]> <[8]>", "root"));
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    assert_non_null(s);
    llama_sampler_accept(s, 7);
    struct llama_sampler *c = llama_sampler_clone(s);
    assert_non_null(c);
    random_logits(d);
    struct llama_sampler *chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(chain, c);
    llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    assert_int_equal(pick(chain, d, g_b, &left), 8);
    free(d);
    llama_sampler_free(chain);
    llama_sampler_free(s);
}

/* temperature + dist: the rest of a sampled chain */
static struct llama_sampler *sampled_rest(uint32_t seed)
{
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(c, llama_sampler_init_temp(0.7f));
    llama_sampler_chain_add(c, llama_sampler_init_dist(seed));
    return c;
}

static struct llama_sampler *checked(const char *gbnf, uint32_t seed)
{
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    struct llama_sampler *g =
        thaw_grammar_check_new(llama_sampler_init_grammar(g_vocab, gbnf, "root"), sampled_rest(seed));
    assert_non_null(g);
    llama_sampler_chain_add(c, g);
    return c;
}

static struct llama_sampler *grammar_first(const char *gbnf, uint32_t seed)
{
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(c, llama_sampler_init_grammar(g_vocab, gbnf, "root"));
    llama_sampler_chain_add(c, sampled_rest(seed));
    return c;
}

#define N_DRAWS 3000

static void a_sampled_pick_has_the_grammar_first_distribution(void **state)
{
    (void)state;
    /* three allowed first tokens, spread over the ranks: " river" near the
     * top (often drawn as is), the others lower (reached by redraws) */
    const char *gbnf = "root ::= \" river\" | \" stone\" | \" light\"";
    llama_token t[3][4];
    const char *words[3] = {" river", " stone", " light"};
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    int seen[2][4] = {{0}};
    size_t left;

    for (int k = 0; k < 3; k++)
        assert_int_equal(llama_tokenize(g_vocab, words[k], (int32_t)strlen(words[k]), t[k], 4, false, false), 1);
    for (int i = 0; i < g_n; i++)
        d[i] = (llama_token_data){i, -2.0f - 4.0f * (float)(i % 7) / 7.0f, 0.0f};
    d[t[0][0]].logit = 3.0f;
    d[t[1][0]].logit = 2.0f;
    d[t[2][0]].logit = 1.0f;
    for (int path = 0; path < 2; path++) {
        for (uint32_t seed = 1; seed <= N_DRAWS; seed++) {
            struct llama_sampler *s = path == 0 ? checked(gbnf, seed) : grammar_first(gbnf, seed);
            llama_token got = pick(s, d, g_b, &left);
            int k = got == t[0][0] ? 0 : got == t[1][0] ? 1 : got == t[2][0] ? 2 : 3;
            if (k == 3) { /* never a token the grammar refuses: another is a start of a word (" ri") */
                char piece[32];
                int n = llama_token_to_piece(g_vocab, got, piece, sizeof piece, 0, false);
                assert_true(n > 0 && (strncmp(piece, words[0], (size_t)n) == 0 || strncmp(piece, words[1], (size_t)n) == 0 ||
                                      strncmp(piece, words[2], (size_t)n) == 0));
            }
            seen[path][k]++;
            llama_sampler_free(s);
        }
    }
    /* softmax(3, 2, 1) / 0.7 over the three: 0.76 / 0.18 / 0.04 (the rest
     * of the vocabulary holds most of the mass before the grammar) */
    for (int k = 0; k < 4; k++) {
        double a = (double)seen[0][k] / N_DRAWS, b = (double)seen[1][k] / N_DRAWS;
        assert_true(fabs(a - b) < 0.03);
    }
    assert_true(seen[0][2] > 30); /* the redraws reach the lowest too */
    free(d);
}

static void an_allowed_draw_is_kept_as_drawn(void **state)
{
    (void)state;
    /* the grammar allows every lowercase word: the draw of the chain
     * without it is allowed often, and then it is that very token */
    const char *gbnf = "root ::= [a-z]+";
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    int same = 0;
    size_t left;

    random_logits(d);
    for (uint32_t seed = 1; seed <= 200; seed++) {
        struct llama_sampler *s = checked(gbnf, seed), *r = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(r, sampled_rest(seed));
        llama_token got = pick(s, d, g_b, &left), free_draw = pick(r, d, g_a, &left);
        char piece[64];
        int n = llama_token_to_piece(g_vocab, got, piece, sizeof piece - 1, 0, false);
        assert_true(n > 0);
        for (int i = 0; i < n; i++)
            assert_true(piece[i] >= 'a' && piece[i] <= 'z');
        same += got == free_draw;
        llama_sampler_free(s);
        llama_sampler_free(r);
    }
    assert_true(same > 0);
    free(d);
}

static void a_checked_clone_carries_the_progress(void **state)
{
    (void)state;
    struct llama_sampler *s = checked("root ::= <[7]> <[8]>", 1);
    llama_token_data *d = malloc((size_t)g_n * sizeof *d);
    size_t left;

    llama_sampler_accept(s, 7);
    struct llama_sampler *c = llama_sampler_clone(s);
    assert_non_null(c);
    random_logits(d);
    assert_int_equal(pick(c, d, g_b, &left), 8);
    free(d);
    llama_sampler_free(c);
    llama_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_picks_on_random_logits),
        cmocka_unit_test(an_allowed_best_candidate_is_decided_alone),
        cmocka_unit_test(an_allowed_token_near_rank_500_is_found_among_the_best_1024),
        cmocka_unit_test(none_of_the_best_allowed_asks_the_whole_array),
        cmocka_unit_test(ties_go_to_the_lower_id),
        cmocka_unit_test(a_clone_carries_the_progress),
        cmocka_unit_test(a_sampled_pick_has_the_grammar_first_distribution),
        cmocka_unit_test(an_allowed_draw_is_kept_as_drawn),
        cmocka_unit_test(a_checked_clone_carries_the_progress),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
