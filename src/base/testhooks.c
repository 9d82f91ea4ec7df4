/* testhooks.c — the test hook table (testhooks.h). */
#include "base/testhooks.h"

#include "base/log.h"

#include <errno.h>
#include <stdlib.h>

static const char *const names[THAW_HOOK_COUNT] = {
    [THAW_HOOK_DISK_FSYNC_DELAY_MS] = "THAW_TEST_DISK_FSYNC_DELAY_MS",
    [THAW_HOOK_SHARED_UPLOAD_DELAY_MS] = "THAW_TEST_SHARED_UPLOAD_DELAY_MS",
    [THAW_HOOK_FIXUP_HOLD] = "THAW_TEST_FIXUP_HOLD",
    [THAW_HOOK_KVTAP_VERIFY] = "THAW_TEST_KVTAP_VERIFY",
    [THAW_HOOK_NOW_S] = "THAW_TEST_NOW_S",
    [THAW_HOOK_LIST_PAGE] = "THAW_TEST_LIST_PAGE",
    [THAW_HOOK_ROUTE_HOLD_MS] = "THAW_TEST_ROUTE_HOLD_MS",
};

static long values[THAW_HOOK_COUNT];

void thaw_test_hooks_load(void)
{
    for (int h = 0; h < THAW_HOOK_COUNT; h++) {
        const char *v = getenv(names[h]);
        char *end;

        values[h] = 0;
        if (!v || !*v)
            continue;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (errno || *end || n <= 0) {
            LOG_WRN("%s=%s: not a positive integer, ignored (a test setting)", names[h], v);
            continue;
        }
        values[h] = n;
        LOG_WRN("%s=%ld: a test setting is on", names[h], n);
    }
}

long thaw_test_hook(enum thaw_test_hook h) { return h >= 0 && h < THAW_HOOK_COUNT ? values[h] : 0; }

const char *thaw_test_hook_name(enum thaw_test_hook h)
{
    return h >= 0 && h < THAW_HOOK_COUNT ? names[h] : "?";
}
