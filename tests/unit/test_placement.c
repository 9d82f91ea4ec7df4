/* test_placement.c — where a model and its context sit (placement.h):
 *   - on the real libllama with generated models, on the CPU: every layer,
 *     the output (output.weight, or gemma3's tied embedding), the weights,
 *     the KV cache and the compute buffers are in host memory, and the bytes
 *     are the model's;
 *   - the text forms: layer ranges per place (split layers apart), cut at a
 *     whole range when short of room; the KV cache's places, devices first.
 * Placement on a device is checked end to end by tests/e2e/test_vulkan.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ggml-backend.h>
#include <llama.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_models.h"
#include "llama/placement.h"

static char g_dir[] = "/tmp/thaw_placement_XXXXXX";

static int group_setup(void **state)
{
    (void)state;
    return fixture_llama_open(g_dir);
}

static int group_teardown(void **state)
{
    (void)state;
    return fixture_llama_close(g_dir);
}

/* A host-only placement of a generated 3-layer model of `arch`. */
static void host_only(const char *arch)
{
    char path[300], buf[64];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, arch);
    char *argv[] = {"mkmodel", "-o", path, "--arch", (char *)arch, "--layers", "3", NULL};
    assert_int_equal(fixture_mkmodel(7, argv), 0);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    assert_non_null(m);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    assert_non_null(ctx);
    struct thaw_placement p;

    assert_int_equal(thaw_placement_init(&p, m, ctx), 0);
    assert_string_equal(p.places[0].name, "host");
    assert_true(p.places[0].host);
    assert_int_equal(p.n_layer, 3);
    assert_int_equal(p.places[0].n_layers, 3);
    assert_true(p.places[0].output);
    /* the model's own size: the weights' buffers hold every byte of it */
    assert_true(p.places[0].weights_bytes >= llama_model_size(m));
    assert_true(p.places[0].kv_bytes > 0);
    assert_true(p.places[0].compute_bytes > 0);
    for (int i = 1; i < p.n_places; i++) { /* a device, if ggml offered one: nothing on it */
        assert_false(p.places[i].host);
        assert_int_equal(p.places[i].n_layers, 0);
        assert_false(p.places[i].output);
        assert_int_equal(p.places[i].kv_bytes, 0);
    }
    thaw_placement_layers(&p, 0, buf, sizeof buf);
    assert_string_equal(buf, "0-2");
    thaw_placement_layers(&p, THAW_PLACE_SPLIT, buf, sizeof buf);
    assert_string_equal(buf, "");
    thaw_placement_kv(&p, buf, sizeof buf);
    assert_string_equal(buf, "host");
    thaw_placement_log(&p);
    thaw_placement_free(&p);
    thaw_placement_free(&p); /* twice: harmless */
    llama_free(ctx);
    llama_model_free(m);
}

static void test_cpu_model_is_all_in_host_memory(void **state)
{
    (void)state;
    host_only("llama");
    host_only("gemma3"); /* no output.weight: the embedding is the head */
}

static void test_text_forms(void **state)
{
    int8_t lp[] = {1, 1, 0, THAW_PLACE_SPLIT, 1, 1, 1, THAW_PLACE_NONE, 2};
    struct thaw_placement p = {.n_places = 3, .n_layer = 9, .layer_place = lp};
    char buf[64];

    (void)state;
    strcpy(p.places[0].name, "host");
    strcpy(p.places[1].name, "Vulkan0");
    strcpy(p.places[2].name, "Vulkan1");
    thaw_placement_layers(&p, 1, buf, sizeof buf);
    assert_string_equal(buf, "0-1,4-6");
    thaw_placement_layers(&p, 0, buf, sizeof buf);
    assert_string_equal(buf, "2");
    thaw_placement_layers(&p, 2, buf, sizeof buf);
    assert_string_equal(buf, "8");
    thaw_placement_layers(&p, THAW_PLACE_SPLIT, buf, sizeof buf);
    assert_string_equal(buf, "3");
    thaw_placement_layers(&p, 1, buf, 6); /* "0-1,4-6" does not fit: the whole ranges that do */
    assert_string_equal(buf, "0-1");
    thaw_placement_layers(&p, 1, buf, 1);
    assert_string_equal(buf, "");

    thaw_placement_kv(&p, buf, sizeof buf);
    assert_string_equal(buf, "none");
    p.places[0].kv_bytes = 10;
    p.places[2].kv_bytes = 20;
    thaw_placement_kv(&p, buf, sizeof buf);
    assert_string_equal(buf, "Vulkan1+host");
    p.places[0].kv_bytes = 0;
    thaw_placement_kv(&p, buf, sizeof buf);
    assert_string_equal(buf, "Vulkan1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_model_is_all_in_host_memory),
        cmocka_unit_test(test_text_forms),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
