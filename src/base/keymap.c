/* keymap.c — see keymap.h. */
#include "base/keymap.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define KEYMAP_FIRST_BUCKETS 64

static size_t bucket(size_t n_b, const uint8_t *key)
{
    return (size_t)XXH3_64bits(key, THAW_KEY_BYTES) & (n_b - 1);
}

int thaw_keymap_init(struct thaw_keymap *m)
{
    m->n = 0;
    m->n_b = KEYMAP_FIRST_BUCKETS;
    m->b = calloc(m->n_b, sizeof *m->b);
    if (!m->b) {
        m->n_b = 0;
        return THAW_ENOMEM;
    }
    return 0;
}

void thaw_keymap_fini(struct thaw_keymap *m)
{
    free(m->b);
    m->b = NULL;
    m->n_b = m->n = 0;
}

struct thaw_keymap_node *thaw_keymap_find(const struct thaw_keymap *m, const uint8_t *key)
{
    if (!m->n_b)
        return NULL;
    struct thaw_keymap_node *n = m->b[bucket(m->n_b, key)];
    while (n && memcmp(n->key, key, THAW_KEY_BYTES) != 0)
        n = n->next;
    return n;
}

static void grow(struct thaw_keymap *m)
{
    size_t n_b = m->n_b ? m->n_b * 2 : KEYMAP_FIRST_BUCKETS;
    struct thaw_keymap_node **b = calloc(n_b, sizeof *b);

    if (!b)
        return;
    for (size_t i = 0; i < m->n_b; i++) {
        for (struct thaw_keymap_node *n = m->b[i], *next; n; n = next) {
            size_t h = bucket(n_b, n->key);

            next = n->next;
            n->next = b[h];
            b[h] = n;
        }
    }
    free(m->b);
    m->b = b;
    m->n_b = n_b;
}

void thaw_keymap_insert(struct thaw_keymap *m, struct thaw_keymap_node *n, const uint8_t *key)
{
    size_t h;

    n->key = key;
    if (m->n >= m->n_b)
        grow(m);
    h = bucket(m->n_b, key);
    n->next = m->b[h];
    m->b[h] = n;
    m->n++;
}

int thaw_keymap_remove(struct thaw_keymap *m, struct thaw_keymap_node *n)
{
    if (!m->n_b || !n->key)
        return 0;
    struct thaw_keymap_node **pp = &m->b[bucket(m->n_b, n->key)];
    while (*pp && *pp != n)
        pp = &(*pp)->next;
    if (!*pp)
        return 0;
    *pp = n->next;
    n->next = NULL;
    m->n--;
    return 1;
}
