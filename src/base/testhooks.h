/* testhooks.h — the settings that exist only for thaw's own tests.
 *
 * Why one table: a test that needs a slow disk, a held-back re-decode or a
 * clock that has moved on gets it from here, by name, and nowhere else
 * reads the environment for such a thing. Each hook is an environment
 * variable (the tests start real `thaw` processes), read once at start-up
 * (thaw_test_hooks_load), and every hook that is set is logged with a WARN,
 * so a log from a server that ran under one says so in its first lines.
 * Unset (production), every hook reads 0 and costs one array load.
 *
 * Settings a user may want (which backends to load, whether stores cut
 * blocks from the KV cache's memory) are flags of `thaw serve`, documented
 * in --help, not hooks.
 */
#ifndef THAW_TESTHOOKS_H
#define THAW_TESTHOOKS_H

#include <stdbool.h>

enum thaw_test_hook {
    /* THAW_TEST_DISK_FSYNC_DELAY_MS: every fsync of the disk tier sleeps
     * this long first (a slow disk: the writer falls behind the replies) */
    THAW_HOOK_DISK_FSYNC_DELAY_MS,
    /* THAW_TEST_SHARED_UPLOAD_DELAY_MS: the shared tier's uploader sleeps
     * this long before an entry's PUT, after its blocks (a window to kill a
     * replica in) */
    THAW_HOOK_SHARED_UPLOAD_DELAY_MS,
    /* THAW_TEST_FIXUP_HOLD: a slot's post-reply re-decoding does not start
     * on its own; it waits for a request that needs the slot (which waits
     * for it or cuts it short, --fixup-wait-ms) or for shutdown. Makes "the
     * next request finds the slot still re-decoding" certain, however fast
     * the test model decodes. */
    THAW_HOOK_FIXUP_HOLD,
    /* THAW_TEST_KVTAP_VERIFY: every store cut from the KV cache's memory is
     * also captured whole and compared; a difference is logged as an error
     * (kvtap.h) */
    THAW_HOOK_KVTAP_VERIFY,
    /* THAW_TEST_NOW_S: `thaw cache gc --shared` takes this as the time
     * (a store's LastModified cannot be set back) */
    THAW_HOOK_NOW_S,
    /* THAW_TEST_LIST_PAGE: the shared tier's listings ask for pages of this
     * many keys (deleting while listing, across pages) */
    THAW_HOOK_LIST_PAGE,
    /* THAW_TEST_ROUTE_HOLD_MS: with many models, a request holds its model
     * this long before its route runs (a model kept busy for as long as a
     * test needs: llama-server's LLAMA_SERVER_DEBUG_FAKE_TIMING, which
     * tests/compat/run-upstream maps onto it for upstream's router tests).
     * POST /models/load is not held. */
    THAW_HOOK_ROUTE_HOLD_MS,
    THAW_HOOK_COUNT
};

/* Reads every hook from the environment and WARNs for each one set (a
 * value that is not a positive integer counts as unset, and is WARNed
 * about too). Call once, first thing, before any thread starts. */
void thaw_test_hooks_load(void);

/* The hook's value; 0 when unset. */
long thaw_test_hook(enum thaw_test_hook h);

/* The hook's environment variable. */
const char *thaw_test_hook_name(enum thaw_test_hook h);

#endif
