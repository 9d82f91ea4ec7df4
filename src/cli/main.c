/* main.c — `thaw <command>`: serve, mkmodel, cache. */
#include "base/testhooks.h"
#include "cli/cache_cli.h"
#include "cli/config.h"
#include "cli/mkmodel.h"
#include "http/server.h"
#include "llama/params.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: thaw <command> [flags]\n\n"
               "commands:\n"
               "  serve     run the OpenAI-compatible chat server (thaw serve --help)\n"
               "  mkmodel   write a random-weight GGUF model for tests and benchmarks (thaw mkmodel --help)\n"
               "  cache     inspect and maintain a --kv-cache-dir (thaw cache --help)\n");
}

/* `thaw serve`: the flags, then the server. argv[0] is "serve". */
static int serve_main(int argc, char **argv)
{
    struct thaw_config cfg;
    int rc, code;

    thaw_config_init(&cfg);
    rc = thaw_config_parse(&cfg, argc, argv);
    if (rc == 1 && cfg.list_devices)
        thaw_params_list_devices(&cfg, stdout);
    if (rc != 0)
        code = rc == 1 ? 0 : 2;
    else
        code = thaw_serve(&cfg);
    thaw_config_free(&cfg);
    return code;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    thaw_test_hooks_load(); /* before any thread; each one set is logged */
    if (strcmp(argv[1], "serve") == 0)
        return serve_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "mkmodel") == 0)
        return thaw_mkmodel_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "cache") == 0)
        return thaw_cache_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "thaw: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
