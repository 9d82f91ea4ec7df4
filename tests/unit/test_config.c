/* test_config.c — flag parsing, bounds and defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/config.h"
#include "base/error.h"

static int parse(struct thaw_config *c, int argc, const char **argv)
{
    thaw_config_init(c);
    return thaw_config_parse(c, argc, (char **)argv);
}

static void test_defaults_and_values(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "-c", "8192", "-np", "2", "--port=9000", "--api-key", "a,b",
                          "--api-key", "c", "--no-cache-prompt", "--kv-cache-dir", "/tmp/k", "--kv-cache-max", "100",
                          "--slot-prompt-similarity", "0.5", "--metrics"};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_string_equal(c.model_path, "x.gguf");
    assert_int_equal(c.n_ctx, 8192);
    assert_int_equal(c.n_parallel, 2);
    assert_int_equal(c.port, 9000);
    assert_int_equal(c.n_api_keys, 3);
    assert_string_equal(c.api_keys[1], "b");
    assert_string_equal(c.api_keys[2], "c");
    assert_false(c.cache_prompt);
    assert_string_equal(c.kv_cache_dir, "/tmp/k");
    assert_int_equal(c.kv_cache_max_mib, 100);
    assert_int_equal(c.kv_cache_ttl_s, 259200);
    assert_int_equal(c.kv_cache_min_tokens, 256);
    assert_int_equal(c.cache_ram_mib, 8192);
    assert_true(c.n_threads >= 1 && c.n_threads_batch == c.n_threads);
    thaw_config_free(&c);
}

static void test_rejects(void **state)
{
    static const char *const bad[][4] = {
        {"-np", "0", NULL},      {"-c", "abc", NULL},         {"--port", "70000", NULL},
        {"--bogus", NULL},       {"-c", NULL},                {"--slot-prompt-similarity", "2", NULL},
        {"--metrics=1", NULL},   {"-t", "1.5", NULL},
    };
    struct thaw_config c;

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[8] = {"serve", "-m", "x.gguf"};
        int n = 3;
        for (int j = 0; bad[i][j]; j++)
            argv[n++] = bad[i][j];
        if (parse(&c, n, argv) != THAW_EINVAL)
            fail_msg("case %zu accepted", i);
        thaw_config_free(&c);
    }
    const char *nomodel[] = {"serve", "-c", "100"};
    assert_int_equal(parse(&c, 3, nomodel), THAW_EINVAL);
    thaw_config_free(&c);
}

static void test_empty_api_keys_refused(void **state)
{
    struct thaw_config c;
    static const char *const bad[] = {"", ",", "a,", ",a", "a,,b"};

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[] = {"serve", "-m", "x.gguf", "--api-key", bad[i]};
        if (parse(&c, 5, argv) != THAW_EINVAL)
            fail_msg("--api-key '%s' was accepted", bad[i]);
        thaw_config_free(&c);
    }
    const char *ok[] = {"serve", "-m", "x.gguf", "--api-key", "a,b"};
    assert_int_equal(parse(&c, 5, ok), 0);
    assert_int_equal(c.n_api_keys, 2);
    thaw_config_free(&c);
}

static void test_http_limits(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "--threads-http", "2", "--max-connections", "50",
                          "--max-connections-per-client", "0", "-to", "5"};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_int_equal(c.threads_http, 2);
    assert_int_equal(c.max_connections, 50);
    assert_int_equal(c.max_per_client, 0);
    assert_int_equal(c.timeout_s, 5);
    const char *zero[] = {"serve", "-m", "x.gguf", "--timeout", "0"};
    assert_int_equal(parse(&c, 5, zero), THAW_EINVAL);
    thaw_config_free(&c);
}

static void test_help_lists_every_flag(void **state)
{
    static char buf[1 << 17]; /* the whole --help: it grows with every flag */
    FILE *f = fmemopen(buf, sizeof buf, "w");

    (void)state;
    thaw_config_usage(f);
    fclose(f);
    static const char *const flags[] = {"--kv-cache-dir", "--kv-cache-ttl", "--cache-ram", "--ctx-checkpoints",
                                        "-np,--parallel", "--api-key", "--max-queue", "[default: 259200]"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(buf, flags[i]))
            fail_msg("--help lacks %s", flags[i]);
}


/* llama-server's syntax for the flags params.c and sampling.c consume */
static void test_llama_server_values(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "-ngl", "all", "-fa", "on", "-ctk", "q8_0", "--cache-type-v=q4_0",
                          "-ts", "3,1", "-sm", "row", "-ot", "exps=CPU,attn=CPU", "-ncmoe", "3", "--no-mmap",
                          "--rope-scale", "4", "--rope-scaling", "yarn", "--override-kv",
                          "tokenizer.ggml.add_bos_token=bool:false", "-fitt", "512", "--temp", "0", "--top_k", "7",
                          "-s", "-1", "--samplers", "top-k;temp", "--dry-sequence-breaker", "none", "-lv", "4",
                          "-nkvo", "--numa", "distribute", "--no-warmup", "-ctkd", "f32",
                          "--spec-draft-type-v", "bf16", "-ngld", "0", "-td", "3"};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_int_equal(c.n_gpu_layers, -2);
    assert_int_equal(c.flash_attn, 1);
    assert_int_equal(c.type_k, 8); /* GGML_TYPE_Q8_0 */
    assert_int_equal(c.type_v, 2); /* GGML_TYPE_Q4_0 */
    assert_true(c.tensor_split[0] == 3.0f && c.tensor_split[1] == 1.0f && c.tensor_split[2] == 0.0f);
    assert_int_equal(c.split_mode, 2);
    assert_int_equal(c.n_tensor_overrides, 1);
    assert_int_equal(c.n_cpu_moe, 3);
    assert_int_equal(c.load_mode, 0);
    assert_true(c.rope_freq_scale == 0.25f);
    assert_int_equal(c.rope_scaling, 2);
    assert_int_equal(c.n_kv_overrides, 1);
    assert_int_equal(c.fit_target_mib[0], 512);
    assert_int_equal(c.fit_target_mib[5], 512); /* one value: every device */
    assert_true(c.sampling.temp == 0.0f);
    assert_int_equal(c.sampling.top_k, 7); /* --top_k reads as --top-k, as in llama-server */
    assert_int_equal(c.sampling.seed, 0xFFFFFFFFu);
    assert_int_equal(c.sampling.n_stages, 2);
    assert_int_equal(c.sampling.stages[0], THAW_STAGE_TOP_K);
    assert_int_equal(c.sampling.stages[1], THAW_STAGE_TEMPERATURE);
    assert_int_equal(c.sampling.n_dry_breakers, 0);
    assert_int_equal(c.verbosity, 2);
    assert_false(c.kv_offload);
    assert_int_equal(c.numa, 1);
    assert_int_equal(c.n_no_effect, 1);
    assert_int_equal(c.draft_type_k, 0);  /* GGML_TYPE_F32: the draft's own, the target's stays q8_0 */
    assert_int_equal(c.draft_type_v, 30); /* GGML_TYPE_BF16 */
    assert_int_equal(c.draft_n_gpu_layers, 0);
    assert_int_equal(c.n_gpu_layers, -2);
    assert_int_equal(c.draft_threads, 3);
    thaw_config_free(&c);
}

/* a flag thaw does not implement is refused by name, never "unknown" */
static void test_refused_and_bad_values(void **state)
{
    static const char *const bad[][3] = {
        {"--spm-infill", NULL}, {"-hf", "a/b"},        {"-kvu", NULL},      {"-ngl", "many"}, {"-fa", "maybe"},
        {"-ctk", "q3_k", NULL}, {"-ot", "noequals"}, {"--override-kv", "a=long:1"}, {"-sm", "diagonal"},
        {"--samplers", "top_q"}, {"--mirostat", "3"}, {"--sampler-seq", "kz"}, {"--pooling", "sum"},
        {"--embd-normalize", "-2"},
    };
    struct thaw_config c;

    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[6] = {"serve", "-m", "x.gguf"};
        int n = 3;
        for (int j = 0; j < 2 && bad[i][j]; j++)
            argv[n++] = bad[i][j];
        if (parse(&c, n, argv) != THAW_EINVAL)
            fail_msg("accepted: %s %s", bad[i][0], bad[i][1] ? bad[i][1] : "");
        thaw_config_free(&c);
    }
}

/* --rerank is --embedding with pooling rank; --pooling takes llama-server's names */
static void test_embedding_flags(void **state)
{
    struct thaw_config c;
    const char *plain[] = {"serve", "-m", "x.gguf"};
    const char *embd[] = {"serve", "-m", "x.gguf", "--embeddings", "--pooling", "last", "--embd-normalize", "-1"};
    const char *rerank[] = {"serve", "-m", "x.gguf", "--reranking"};
    const char *conflict[] = {"serve", "-m", "x.gguf", "--rerank", "--pooling", "mean"};
    const char *draft[] = {"serve", "-m", "x.gguf", "--embedding", "-md", "d.gguf"};

    (void)state;
    assert_int_equal(parse(&c, 3, plain), 0);
    assert_false(c.embedding);
    assert_int_equal(c.pooling, -1); /* the model's */
    assert_int_equal(c.embd_normalize, 2);
    thaw_config_free(&c);
    assert_int_equal(parse(&c, sizeof embd / sizeof *embd, embd), 0);
    assert_true(c.embedding);
    assert_false(c.reranking);
    assert_int_equal(c.pooling, 3); /* LLAMA_POOLING_TYPE_LAST */
    assert_int_equal(c.embd_normalize, -1);
    thaw_config_free(&c);
    assert_int_equal(parse(&c, sizeof rerank / sizeof *rerank, rerank), 0);
    assert_true(c.embedding && c.reranking);
    assert_int_equal(c.pooling, 4); /* LLAMA_POOLING_TYPE_RANK */
    thaw_config_free(&c);
    assert_int_equal(parse(&c, sizeof conflict / sizeof *conflict, conflict), THAW_EINVAL);
    thaw_config_free(&c);
    assert_int_equal(parse(&c, sizeof draft / sizeof *draft, draft), THAW_EINVAL);
    thaw_config_free(&c);
}

/* the default breakers are llama-server's; the first flag replaces them, later ones add */
static void test_dry_breakers(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "--dry-sequence-breaker", "\\n\\n", "--dry-sequence-breaker", "."};

    (void)state;
    thaw_config_init(&c);
    assert_int_equal(c.sampling.n_dry_breakers, 4);
    assert_string_equal(c.sampling.dry_breakers, "\n");
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    assert_int_equal(c.sampling.n_dry_breakers, 2);
    assert_string_equal(c.sampling.dry_breakers, "\n\n");
    assert_string_equal(c.sampling.dry_breakers + 3, ".");
    thaw_config_free(&c);
}

/* -C / -Cr as llama-server parses them (the last hex digit is CPUs 0-3,
 * both add to one mask); what the -batch forms leave unset is the same as
 * the generation threads' */
static void test_cpu_placement(void **state)
{
    struct thaw_config c;
    const char *argv[] = {"serve", "-m", "x.gguf", "-C", "0x12", "-Cr", "8-9", "--poll", "0", "--prio", "2",
                          "--poll-batch", "30"};
    static const char *const bad[][2] = {{"-C", "0xg1"}, {"-C", "0x"}, {"-Cr", "7"}, {"-Cr", "9-3"},
                                         {"-Cr", "0-512"}, {"--poll", "101"}, {"--prio", "-2"}};

    (void)state;
    assert_int_equal(parse(&c, sizeof argv / sizeof *argv, argv), 0);
    for (int i = 0; i < 16; i++)
        assert_int_equal(c.cpu.mask[i], i == 1 || i == 4 || i == 8 || i == 9);
    assert_true(c.cpu.mask_valid);
    assert_int_equal(c.cpu.poll, 0);
    assert_int_equal(c.cpu.prio, 2);
    assert_int_equal(c.cpu_batch.poll, 30);
    assert_int_equal(c.cpu_batch.prio, 2);
    assert_int_equal(c.cpu_batch.strict, 0);
    assert_true(c.cpu_batch.mask_valid && c.cpu_batch.mask[4] && !c.cpu_batch.mask[5]);
    thaw_config_free(&c);

    const char *dflt[] = {"serve", "-m", "x.gguf", "-Crb", "-1"};
    assert_int_equal(parse(&c, 5, dflt), 0);
    assert_false(c.cpu.mask_valid);
    assert_int_equal(c.cpu.poll, 50); /* llama-server's */
    assert_int_equal(c.cpu_batch.poll, 50);
    assert_true(c.cpu_batch.mask_valid && c.cpu_batch.mask[0] && c.cpu_batch.mask[1] && !c.cpu_batch.mask[2]);
    thaw_config_free(&c);

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *a[] = {"serve", "-m", "x.gguf", bad[i][0], bad[i][1]};
        if (parse(&c, 5, a) != THAW_EINVAL)
            fail_msg("accepted: %s %s", bad[i][0], bad[i][1]);
        thaw_config_free(&c);
    }
}

/* --models-preset: each [NAME] a config of its own, llama-server's order
 * (the command line over [NAME] over [*]), switches as true/false. */
static void test_models_preset(void **state)
{
    char path[64];
    struct thaw_config c;
    FILE *f;

    (void)state;
    snprintf(path, sizeof path, "/tmp/thaw_test_config_%d.ini", (int)getpid());
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("[*]\nc = 512\ntemp = 0.25\n"
          "[a]\nmodel = /m/a.gguf\nctx-size = 1024\nnp = 3\njinja = false\nswa-full = true\n"
          "ctk = q8_0\nload-on-startup = true\n"
          "[b]\nm = /m/b.gguf\nno-jinja = true\nalias = x,y\n",
          f);
    fclose(f);
    const char *argv[] = {"serve", "--models-preset", path, "-np", "2"};
    assert_int_equal(parse(&c, 5, argv), 0);
    unlink(path);
    assert_int_equal(c.n_presets, 2);
    const struct thaw_config *a = c.presets[0].cfg, *b = c.presets[1].cfg;
    assert_string_equal(c.presets[0].name, "a");
    assert_string_equal(a->model_path, "/m/a.gguf");
    assert_int_equal(a->n_ctx, 1024);  /* [a] over [*] */
    assert_int_equal(a->n_parallel, 2); /* the command line over [a] */
    assert_false(a->jinja);
    assert_true(a->swa_full);
    assert_true(a->sampling.temp == 0.25f);
    assert_true(c.presets[0].load_on_startup);
    assert_string_equal(b->model_path, "/m/b.gguf");
    assert_int_equal(b->n_ctx, 512);
    assert_false(b->jinja);
    assert_string_equal(b->alias, "x,y");
    assert_false(c.presets[1].load_on_startup);
    assert_null(c.preset_base); /* no --models-dir: no file no section names */
    thaw_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_empty_api_keys_refused),
        cmocka_unit_test(test_http_limits),
        cmocka_unit_test(test_help_lists_every_flag),
        cmocka_unit_test(test_llama_server_values),
        cmocka_unit_test(test_refused_and_bad_values),
        cmocka_unit_test(test_embedding_flags),
        cmocka_unit_test(test_dry_breakers),
        cmocka_unit_test(test_cpu_placement),
        cmocka_unit_test(test_models_preset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
