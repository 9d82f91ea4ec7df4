/* fixture_models.c — `thaw mkmodel` run as a process (fixture_models.h). */
#include "fixture_models.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

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
