/* fixture_models.c — `thaw mkmodel` run as a process (fixture_models.h). */
#include "fixture_models.h"

#include <ggml-backend.h>
#include <llama.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int fixture_mkmodel(int argc, char **argv)
{
    const char *bin = getenv("THAW_BIN");
    char *args[64];
    int n = 0, status = 0;
    pid_t pid;

    if (!bin || !*bin)
        bin = THAW_BIN;
    if (argc < 1 || argc > 62)
        return -1;
    args[n++] = (char *)bin;
    args[n++] = "mkmodel";
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    if (posix_spawn(&pid, bin, NULL, NULL, args, environ) != 0) {
        fprintf(stderr, "fixture_mkmodel: cannot run %s\n", bin);
        return -1;
    }
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* libllama's errors only with THAW_TEST_VERBOSE set */
static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR && getenv("THAW_TEST_VERBOSE"))
        fputs(text, stderr);
}

int fixture_llama_open(char *dir)
{
    const char *bdir = getenv("THAW_BACKEND_DIR");

    llama_log_set(quiet, NULL);
    llama_backend_init();
    ggml_backend_load_all_from_path(bdir && *bdir ? bdir : THAW_LLAMA_LIB_DIR);
    return mkdtemp(dir) ? 0 : -1;
}

struct llama_model *fixture_vocab_model(const char *name)
{
    char path[4096];
    struct llama_model_params mp = llama_model_default_params();

    mp.vocab_only = true;
    snprintf(path, sizeof path, "%s/.deps/llama.cpp/models/ggml-vocab-%s.gguf", THAW_SOURCE_DIR, name);
    return llama_model_load_from_file(path, mp);
}

int fixture_llama_close(const char *dir)
{
    char *argv[] = {"rm", "-rf", (char *)dir, NULL};
    int status = 0;
    pid_t pid;

    llama_backend_free();
    if (posix_spawnp(&pid, "rm", NULL, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) < 0)
        return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}
