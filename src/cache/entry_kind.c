/* entry_kind.c — which format a disk entry's .kv is in (entry_kind.h),
 * asked of the formats themselves. */
#include "cache/entry_kind.h"

#include "base/error.h"
#include "cache/cache_disk.h"
#include "cache/manifest.h"
#include "cache/snapshots.h"
#include "llama/kvlayout.h"
#include "llama/kvstate.h"

enum thaw_entry_kind thaw_entry_kind(const void *kv, size_t n)
{
    if (thaw_manifest_is(kv, n))
        return THAW_ENTRY_MANIFEST;
    if (thaw_kvlayout_is_block(kv, n))
        return THAW_ENTRY_BLOCK;
    if (thaw_snapshots_is(kv, n))
        return THAW_ENTRY_SNAPSHOT;
    if (thaw_kvstate_is(kv, n))
        return THAW_ENTRY_STATE;
    return THAW_ENTRY_OTHER;
}

int thaw_entry_classify(void *ud, const void *kv, size_t n, const uint8_t **refs, uint32_t *n_refs)
{
    uint32_t pos0, cells;

    (void)ud;
    switch (thaw_entry_kind(kv, n)) {
    case THAW_ENTRY_MANIFEST:
        if (thaw_manifest_ids(kv, n, refs, n_refs) != 0) {
            *refs = NULL; /* it will not load either: a miss, naming nothing */
            *n_refs = 0;
        }
        return THAW_DISK_KIND_ROOT;
    case THAW_ENTRY_BLOCK:
        return thaw_kvlayout_block_info(kv, n, &pos0, &cells) == 0 ? THAW_DISK_KIND_BLOCK : THAW_DISK_KIND_ROOT;
    case THAW_ENTRY_SNAPSHOT:
        return THAW_DISK_KIND_BLOCK; /* a snapshot lives as a block does: while a manifest names it */
    case THAW_ENTRY_STATE:
    case THAW_ENTRY_OTHER:
        break;
    }
    return THAW_DISK_KIND_ROOT;
}

int thaw_entry_tokens(const void *head, size_t n, size_t *off, uint32_t *n_tokens)
{
    switch (thaw_entry_kind(head, n)) {
    case THAW_ENTRY_MANIFEST:
        return thaw_manifest_head_tokens(head, n, off, n_tokens);
    case THAW_ENTRY_STATE:
        return thaw_kvstate_head_tokens(head, n, off, n_tokens);
    case THAW_ENTRY_BLOCK:
    case THAW_ENTRY_SNAPSHOT:
    case THAW_ENTRY_OTHER:
        break;
    }
    return THAW_ENOTFOUND;
}
