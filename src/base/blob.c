/* blob.c — reference-counted byte buffers; see blob.h. */
#include "base/blob.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define MAP_MIN HUGE_PAGE /* below this: malloc */

/* Freed mappings kept for the next large alloc (see blob.h). */
#define POOL_SLOTS 4
#define POOL_MAX_BYTES ((size_t)512 << 20)

static struct {
    pthread_mutex_t mu;
    struct {
        void *base;
        size_t len;
    } v[POOL_SLOTS];
    int n;
    size_t bytes;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The smallest pooled mapping of len to 2 * len bytes, or NULL. The bound
 * keeps a small state from pinning a large, touched mapping that the RAM
 * tier's budget would count at the state's size. */
static void *pool_take(size_t len, size_t *map_len)
{
    void *base = NULL;
    int best = -1;

    pthread_mutex_lock(&pool.mu);
    for (int i = 0; i < pool.n; i++)
        if (pool.v[i].len >= len && pool.v[i].len / 2 <= len && (best < 0 || pool.v[i].len < pool.v[best].len))
            best = i;
    if (best >= 0) {
        base = pool.v[best].base;
        *map_len = pool.v[best].len;
        pool.bytes -= pool.v[best].len;
        pool.v[best] = pool.v[--pool.n];
    }
    pthread_mutex_unlock(&pool.mu);
    return base;
}

/* Keeps a freed mapping for reuse. When the pool is full, the smallest
 * mapping goes (this one, or a smaller one kept before): the larger the
 * mapping, the more its first touch would cost again. */
static void pool_give(void *base, size_t len)
{
    bool kept = false;

    pthread_mutex_lock(&pool.mu);
    if (len <= POOL_MAX_BYTES) {
        while (pool.n > 0 && (pool.n == POOL_SLOTS || pool.bytes + len > POOL_MAX_BYTES)) {
            int small = 0;
            for (int i = 1; i < pool.n; i++)
                if (pool.v[i].len < pool.v[small].len)
                    small = i;
            if (pool.v[small].len >= len)
                break;
            munmap(pool.v[small].base, pool.v[small].len);
            pool.bytes -= pool.v[small].len;
            pool.v[small] = pool.v[--pool.n];
        }
        if (pool.n < POOL_SLOTS && pool.bytes + len <= POOL_MAX_BYTES) {
            pool.v[pool.n].base = base;
            pool.v[pool.n].len = len;
            pool.n++;
            pool.bytes += len;
            kept = true;
        }
    }
    pthread_mutex_unlock(&pool.mu);
    if (!kept)
        munmap(base, len);
}

/* Sits just before the bytes handed out; 64 bytes keeps them aligned. */
struct blob_head {
    atomic_size_t refs;
    void *base;     /* mapping start, or the malloc block */
    size_t map_len; /* 0 = malloc'd */
    char pad[64 - sizeof(atomic_size_t) - sizeof(void *) - sizeof(size_t)];
};

_Static_assert(sizeof(struct blob_head) == 64, "blob header must keep data 64-byte aligned");

/* A mapping of at least len bytes plus a quarter of headroom (address
 * space only until touched: it lets a pooled mapping take a conversation's
 * next, longer state), starting on a huge-page boundary so each whole
 * 2 MiB can be one huge page. */
static void *map_aligned(size_t len, size_t *map_len)
{
    size_t want = (len + len / 4 + 4095) & ~(size_t)4095;
    size_t span = want + HUGE_PAGE;
    uint8_t *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (m == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > m)
        munmap(m, (size_t)(a - m));
    if (a + want < m + span)
        munmap(a + want, (size_t)(m + span - (a + want)));
#ifdef MADV_HUGEPAGE
    madvise(a, want, MADV_HUGEPAGE); /* advice only: without THP it is plain pages */
#endif
    *map_len = want;
    return a;
}

void thaw_blob_pool_drain(void)
{
    pthread_mutex_lock(&pool.mu);
    for (int i = 0; i < pool.n; i++)
        munmap(pool.v[i].base, pool.v[i].len);
    pool.n = 0;
    pool.bytes = 0;
    pthread_mutex_unlock(&pool.mu);
}

size_t thaw_blob_pool_warm(size_t n)
{
    if (n + sizeof(struct blob_head) < MAP_MIN)
        return 0;
    volatile uint8_t *p = thaw_blob_alloc(n);
    if (!p)
        return 0;
    for (size_t off = 0; off < n; off += 4096)
        p[off] = 0;
    thaw_blob_unref((void *)p);
    return n;
}

void *thaw_blob_alloc(size_t n)
{
    struct blob_head *h;
    void *base;
    size_t map_len = 0;

    if (n == 0 || n > SIZE_MAX - 2 * HUGE_PAGE)
        return NULL;
    if (n + sizeof *h >= MAP_MIN) {
        base = pool_take(n + sizeof *h, &map_len);
        if (!base)
            base = map_aligned(n + sizeof *h, &map_len);
    } else if (posix_memalign(&base, 64, n + sizeof *h) != 0)
        base = NULL;
    if (!base)
        return NULL;
    h = base;
    atomic_init(&h->refs, 1);
    h->base = base;
    h->map_len = map_len;
    return h + 1;
}

void *thaw_blob_ref(void *p)
{
    struct blob_head *h = (struct blob_head *)p - 1;

    atomic_fetch_add_explicit(&h->refs, 1, memory_order_relaxed);
    return p;
}

int thaw_blob_unique(void *p)
{
    struct blob_head *h = (struct blob_head *)p - 1;

    return atomic_load_explicit(&h->refs, memory_order_acquire) == 1;
}

void thaw_blob_unref(void *p)
{
    if (!p)
        return;
    struct blob_head *h = (struct blob_head *)p - 1;
    if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (h->map_len)
        pool_give(h->base, h->map_len);
    else
        free(h->base);
}
