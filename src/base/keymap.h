/* keymap.h — the one hash map of 32-byte keys (content hashes: entries,
 * blocks, refcounts), intrusive: a user embeds a thaw_keymap_node in its
 * struct and owns that struct's memory; the map only links nodes.
 *
 * Chained buckets, a power of two that doubles when the map holds as many
 * nodes as buckets. Buckets are chosen by XXH3-64 of the key. Not
 * thread-safe: the owner's lock guards it (cache_disk.c's mu; cache_ram.c
 * runs on the engine thread only). */
#ifndef THAW_KEYMAP_H
#define THAW_KEYMAP_H

#include "base/key.h"

#include <stddef.h>
#include <stdint.h>

struct thaw_keymap_node {
    struct thaw_keymap_node *next; /* the bucket's chain */
    const uint8_t *key;            /* THAW_KEY_BYTES, owned by the embedding struct */
};

struct thaw_keymap {
    struct thaw_keymap_node **b;
    size_t n_b; /* buckets, a power of two */
    size_t n;   /* nodes linked */
};

/* Caller storage. 0, or THAW_ENOMEM (m then holds no buckets; _fini is a no-op). */
int thaw_keymap_init(struct thaw_keymap *m);
/* Frees the buckets, not the nodes (the caller walks them first when it owns them). */
void thaw_keymap_fini(struct thaw_keymap *m);

/* The node whose key equals key, or NULL. */
struct thaw_keymap_node *thaw_keymap_find(const struct thaw_keymap *m, const uint8_t *key);
/* Links n under key (pointing into n's own struct, alive while linked).
 * The key must not be in the map. Growth that runs out of memory keeps the
 * buckets as they are: longer chains, still correct. */
void thaw_keymap_insert(struct thaw_keymap *m, struct thaw_keymap_node *n, const uint8_t *key);
/* Unlinks n if it is linked; returns 1 if it was, 0 if not. */
int thaw_keymap_remove(struct thaw_keymap *m, struct thaw_keymap_node *n);

/* Every node, in no particular order; the body may remove (and free) the
 * current node, nothing else. i: a size_t, n and nx: node pointers, named
 * by the caller. */
#define THAW_KEYMAP_EACH(m, i, n, nx)                                                                                \
    for (size_t i = 0; i < (m)->n_b; i++)                                                                            \
        for (struct thaw_keymap_node *n = (m)->b[i], *nx = n ? n->next : NULL; n; n = nx, nx = n ? n->next : NULL)

/* The struct of type T whose member `member` is the node n (as containerof). */
#define THAW_KEYMAP_OF(n, T, member) ((T *)(void *)((char *)(n) - offsetof(T, member)))

#endif
