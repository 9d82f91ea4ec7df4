/* log.c — timestamped log lines on stderr (and --log-file). */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_verbosity = 1;
/* set once by thaw_log_setup before any other thread starts, read-only after */
static FILE *g_file;
static bool g_colors, g_prefix = true, g_timestamps = true;

void thaw_log_set_verbosity(int verbosity) { atomic_store(&g_verbosity, verbosity); }

int thaw_log_verbosity(void) { return atomic_load(&g_verbosity); }

int thaw_log_setup(int verbosity, const char *file, int colors, bool prefix, bool timestamps)
{
    thaw_log_set_verbosity(verbosity);
    g_prefix = prefix;
    g_timestamps = timestamps;
    g_colors = colors < 0 ? isatty(STDERR_FILENO) != 0 : colors != 0;
    if (file && !(g_file = fopen(file, "a"))) {
        fprintf(stderr, "thaw: --log-file %s: cannot open it\n", file);
        return -1;
    }
    if (g_file)
        setvbuf(g_file, NULL, _IOLBF, 0);
    return 0;
}

void thaw_log(enum thaw_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    static const char *const colors[] = {"\033[31m", "\033[33m", "", "\033[90m"};
    char line[2048];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n = 0, pre;

    if ((int)level > atomic_load(&g_verbosity))
        return;
    if (g_timestamps) {
        gettimeofday(&tv, NULL);
        localtime_r(&tv.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000));
    }
    pre = n; /* the colour goes after the time, around the level */
    if (g_prefix)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s ", names[level + 1]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (g_colors && g_prefix && colors[level + 1][0])
        fprintf(stderr, "%.*s%s%.5s\033[0m%s\n", pre, line, colors[level + 1], line + pre, line + pre + 5);
    else
        fprintf(stderr, "%s\n", line);
    if (g_file)
        fprintf(g_file, "%s\n", line);
}
