/* fuzz_manifest.c — libFuzzer target: block-store manifests through
 * manifest.c (layout: top of manifest.h) and blocks.c, what a disk hit on
 * a conversation reads before it fetches the blocks it names.
 *
 * Every input goes to:
 *   1. thaw_manifest_is(): 1 exactly when it is at least a header
 *      long and starts with "TMF1".
 *   2. thaw_manifest_ids() (what `thaw cache` lists): 0,
 *      THAW_ECORRUPT or THAW_EVERSION. On 0 the lengths of the header add up
 *      to the input exactly, n_ids = n_tokens / block_tokens, and the ids lie
 *      inside the input right after the tokens (read end to end, so ASan sees
 *      any that do not).
 *   3. thaw_blocks_load() (thaw_snapshots_load() for a manifest naming
 *      snapshots) over an empty disk cache opened once per process
 *      in a scratch directory (removed at exit): 0, THAW_ECORRUPT,
 *      THAW_EVERSION, THAW_ENOTFOUND (a named block is not on disk) or
 *      THAW_ENOMEM, and it agrees with (2): a manifest (2) refuses fails with
 *      the same code. With nothing on disk only manifests without whole
 *      blocks load; then the state is a .kv blob (kvstate.h) of the
 *      manifest's tokens whose cells are those tokens: the tail block holds
 *      positions 0..n_tokens-1, and without an SWA part the assembled state
 *      parses (kvlayout.h) to n_tokens cells.
 * Any broken promise aborts: a crash to libFuzzer.
 */
#include "base/error.h"
#include "cache/blocks.h"
#include "cache/cache_disk.h"
#include "cache/manifest.h"
#include "cache/snapshots.h"
#include "llama/kvlayout.h"
#include "llama/kvstate.h"

#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADER 40 /* u32 magic, version, n_tokens, block_tokens, n_blocks, reserved; u64 tail, swa */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;
static struct thaw_disk_cache *g_cache;
static char g_dir[PATH_MAX];
static int g_tried;

static void check(int ok)
{
    if (!ok)
        abort();
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[PATH_MAX];

    if (d) {
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void close_cache(void)
{
    thaw_disk_cache_close(g_cache);
    rm_tree(g_dir);
}

/* The scratch cache, opened on first use; NULL if that failed (the load
 * pass is then skipped). */
static struct thaw_disk_cache *cache(void)
{
    struct thaw_disk_cache_params p = thaw_disk_cache_default_params();
    const char *tmp = getenv("TMPDIR");

    if (g_tried)
        return g_cache;
    g_tried = 1;
    snprintf(g_dir, sizeof g_dir, "%s/thaw-fuzz-manifest.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir))
        return NULL;
    p.dir = g_dir;
    p.flags = THAW_DISK_CACHE_NO_WRITER;
    if (thaw_disk_cache_open(&p, &g_cache) != 0) {
        g_cache = NULL;
        rmdir(g_dir);
        return NULL;
    }
    atexit(close_cache);
    return g_cache;
}

static uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t u64_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    const uint8_t *ids = NULL;
    uint32_t n_ids = 0;
    int rc_ids, rc;

    check(thaw_manifest_is(data, n) == (n >= HEADER && memcmp(data, "TMF1", 4) == 0));

    rc_ids = thaw_manifest_ids(data, n, &ids, &n_ids);
    check(rc_ids == 0 || rc_ids == THAW_ECORRUPT || rc_ids == THAW_EVERSION);
    if (rc_ids == 0) {
        uint32_t n_tokens = u32_at(data + 8), block_tokens = u32_at(data + 12), n_blocks = u32_at(data + 16);
        uint64_t tail = u64_at(data + 24), swa = u64_at(data + 32);
        check(thaw_manifest_is(data, n));
        check(block_tokens > 0 && n_ids == n_blocks && n_ids == n_tokens / block_tokens);
        check(ids == data + HEADER + 4 * (size_t)n_tokens);
        check((uint64_t)HEADER + 4 * (uint64_t)n_tokens + 32 * (uint64_t)n_ids + tail + swa == n);
        uint8_t x = 0;
        for (size_t i = 0; i < (size_t)n_ids * THAW_KEY_BYTES; i++)
            x ^= ids[i];
        sink = x;
    }

    struct thaw_disk_cache *c = cache();
    if (!c)
        return 0;
    struct thaw_kvlayout_frame f = {0, 1, 0};
    struct thaw_blocks_state st;
    /* as a restore picks its loader: a hybrid's manifest names snapshots */
    const uint8_t *snaps;
    uint32_t n_snaps = 0;
    if (thaw_manifest_snaps(data, n, &snaps, &n_snaps) == 0 && n_snaps)
        rc = thaw_snapshots_load(c, NULL, data, n, &f, &st);
    else
        rc = thaw_blocks_load(c, NULL, data, n, &f, &st);
    check(rc == 0 || rc == THAW_ECORRUPT || rc == THAW_EVERSION || rc == THAW_ENOTFOUND || rc == THAW_ENOMEM);
    check(rc_ids == 0 || rc == rc_ids);
    if (rc != 0) {
        check(st.kv == NULL && st.n_kv == 0);
        return 0;
    }

    /* loaded with nothing on disk: no whole blocks, all cells in the tail */
    uint32_t n_tokens = u32_at(data + 8);
    uint64_t tail = u64_at(data + 24), swa = u64_at(data + 32);
    const uint8_t *tail_blk = data + HEADER + 4 * (size_t)n_tokens;
    uint32_t pos0, cells;
    check(n_ids == 0 && st.n_blocks == 0 && st.n_tokens == (int)n_tokens);
    check(thaw_kvlayout_block_info(tail_blk, (size_t)tail, &pos0, &cells) == 0 && pos0 == 0 && cells == n_tokens);

    struct thaw_kvstate_view v;
    check(thaw_kvstate_parse(st.kv, st.n_kv, &v) == 0 && v.n_tokens == (int)n_tokens &&
          memcmp(v.tokens, data + HEADER, 4 * (size_t)n_tokens) == 0);
    if (swa == 0) {
        struct thaw_kvlayout *l = NULL;
        rc = thaw_kvlayout_parse(v.state, v.n_state, &l);
        check(rc == 0 || rc == THAW_ENOMEM);
        check(rc != 0 || thaw_kvlayout_n_cells(l) == n_tokens);
        thaw_kvlayout_free(l);
    }
    thaw_blocks_state_free(&st);
    return 0;
}
