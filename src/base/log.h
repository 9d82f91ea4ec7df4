/* log.h — one readable line per event on stderr: "HH:MM:SS.mmm LEVEL message".
 * Thread-safe (each line is written with a single fputs under stdio's lock). */
#ifndef THAW_LOG_H
#define THAW_LOG_H

enum thaw_log_level { THAW_LOG_ERROR = -1, THAW_LOG_WARN = 0, THAW_LOG_INFO = 1, THAW_LOG_DEBUG = 2 };

#include <stdbool.h>

/* Lines above `verbosity` are dropped. 1 (info) by default. */
void thaw_log_set_verbosity(int verbosity);
int thaw_log_verbosity(void);

/* Once at start-up, before other threads: verbosity, a file every line is
 * also appended to (NULL = none), colours (1, 0, -1 = when stderr is a
 * terminal), the level prefix and the time on each line. Returns 0, or -1
 * when the file cannot be opened (reason printed). */
int thaw_log_setup(int verbosity, const char *file, int colors, bool prefix, bool timestamps);

void thaw_log(enum thaw_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERR(...) thaw_log(THAW_LOG_ERROR, __VA_ARGS__)
#define LOG_WRN(...) thaw_log(THAW_LOG_WARN, __VA_ARGS__)
#define LOG_INF(...) thaw_log(THAW_LOG_INFO, __VA_ARGS__)
#define LOG_DBG(...) thaw_log(THAW_LOG_DEBUG, __VA_ARGS__)

#endif
