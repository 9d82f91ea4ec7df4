/* blob.h — reference-counted byte buffers for cached state.
 *
 * A conversation's captured state (.kv, .ckpt, .dft) is tens to hundreds of
 * MiB. Both cache tiers hold the very same bytes, so they share one buffer:
 * the RAM tier keeps a reference, the disk writer takes another and drops it
 * once the files are written. No copy is made on the engine thread.
 *
 * Large buffers are their own anonymous mappings, asked for transparent
 * huge pages: faulting in 18 MiB page by page cost ~50 ms on the engine
 * thread (measured on a 2-core VM, where a page's first touch traps to the
 * host), 2 MiB pages make it a few on bare metal. A freed mapping is kept
 * (up to 4, 512 MiB; when full, the smallest goes) and handed to the next
 * large alloc it fits without being over twice its size: its pages are
 * already in, so a capture into it costs only the copy. Mappings carry a quarter of untouched headroom,
 * so one freed by a conversation's turn fits its next, longer turn. Small
 * buffers come from malloc.
 *
 * References may be dropped from any thread (the count is atomic).
 */
#ifndef THAW_BLOB_H
#define THAW_BLOB_H

#include <stddef.h>

/* The parts of one conversation's captured state. Both cache tiers hold an
 * entry as these, each part a blob (or absent). */
enum thaw_part {
    THAW_PART_KV,   /* target context state (kvstate.h); mandatory */
    THAW_PART_CKPT, /* context checkpoints; absent without SWA / recurrent memory */
    THAW_PART_DFT,  /* draft context state; its corruption alone costs only this part */
    THAW_PART_COUNT
};

/* A part's bytes. A part with size 0 is absent (data is then ignored). */
struct thaw_part_blob {
    void *data;
    size_t size;
};

/* A new buffer of n bytes (contents undefined) holding one reference, or
 * NULL when out of memory (also for n == 0). */
void *thaw_blob_alloc(size_t n);

/* Takes another reference to p (a thaw_blob_alloc result) and returns p. */
void *thaw_blob_ref(void *p);

/* Drops a reference; the last one frees the buffer (a large one into the
 * pool). NULL is a no-op. */
void thaw_blob_unref(void *p);

/* 1 when the caller's reference to p is the only one (p may be reused for
 * new contents), else 0. */
int thaw_blob_unique(void *p);

/* Puts into the pool a mapping for n bytes whose pages are already in
 * (each touched once), so that the first large alloc of that size after a
 * start (a restore from blocks, blocks.c) costs only its copy. Returns n,
 * or 0 (too small to be pooled, out of memory). */
size_t thaw_blob_pool_warm(size_t n);

/* Unmaps every pooled mapping (memory back to the system). */
void thaw_blob_pool_drain(void);

#endif
