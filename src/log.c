/* log.c — timestamped log lines on stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static atomic_int g_verbosity = 1;

void thaw_log_set_verbosity(int verbosity) { atomic_store(&g_verbosity, verbosity); }

int thaw_log_verbosity(void) { return atomic_load(&g_verbosity); }

void thaw_log(enum thaw_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    char line[2048];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    if ((int)level > atomic_load(&g_verbosity))
        return;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d %s ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (int)(tv.tv_usec / 1000), names[level + 1]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
