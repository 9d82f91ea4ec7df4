/* bench/h2d.c — the device's plain copy rate between host and device memory,
 * through the same ggml backend API libllama restores a KV cache with
 * (ggml_backend_tensor_set / _get), so bench/gpu can set a restore's bytes/s
 * beside what the bus gives in the same run. bench/gpu builds it with the C
 * compiler against the llama.cpp thaw links (its include/ and lib/); it loads
 * the backend modules from DIR as thaw does.
 *
 * One buffer of MiB on DEVICE, copied into and out of, REPS times after one
 * warm-up (the first copy of a device maps and initialises), the best rate
 * kept:
 *   whole    one call of MiB
 *   chunked  CHUNKS calls of MiB / CHUNKS each, in order (a restore through
 *            llama_state_seq_set_data copies each layer's K and V in one call:
 *            CHUNKS = 2 x layers gives its call size)
 * from malloc'd (pageable) memory, as libllama's restore copies, and from the
 * device's pinned host buffer type where it has one.
 *
 * Prints one JSON line: {"device", "description", "bytes", "chunks",
 * "h2d": {"whole", "chunked"}, "d2h": {...}, "h2d_pinned": {...} or null,
 * "d2h_pinned": ...}, rates in bytes per second. Exit 0, or 1 with a line on
 * stderr (no such device, a buffer it cannot allocate).
 *
 * usage: h2d DIR DEVICE MiB CHUNKS [REPS]
 */
#include <ggml-backend.h>
#include <ggml.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct rates {
    double whole, chunked; /* bytes per second, the best of the reps */
};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One pass over t's n bytes in `chunks` calls; returns its seconds. */
static double copy(struct ggml_tensor *t, uint8_t *host, size_t n, int chunks, int up)
{
    size_t step = n / (size_t)chunks;
    double t0 = now_s();

    for (int i = 0; i < chunks; i++) {
        size_t off = (size_t)i * step, len = i == chunks - 1 ? n - off : step;
        if (up)
            ggml_backend_tensor_set(t, host + off, off, len);
        else
            ggml_backend_tensor_get(t, host + off, off, len);
    }
    return now_s() - t0;
}

static struct rates measure(struct ggml_tensor *t, uint8_t *host, size_t n, int chunks, int reps, int up)
{
    struct rates r = {0, 0};

    copy(t, host, n, 1, up); /* warm-up, not counted */
    for (int i = 0; i < reps; i++) {
        double w = (double)n / copy(t, host, n, 1, up), c = (double)n / copy(t, host, n, chunks, up);
        r.whole = w > r.whole ? w : r.whole;
        r.chunked = c > r.chunked ? c : r.chunked;
    }
    return r;
}

/* s as a JSON string's contents (a device's description is free text) */
static void print_str(const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s >= 0x20)
            putchar(*s);
}

static void print_rates(const char *name, const struct rates *r)
{
    if (r)
        printf(", \"%s\": {\"whole\": %.0f, \"chunked\": %.0f}", name, r->whole, r->chunked);
    else
        printf(", \"%s\": null", name);
}

int main(int argc, char **argv)
{
    struct ggml_context *ctx = NULL;
    ggml_backend_buffer_t dbuf = NULL, pbuf = NULL;
    ggml_backend_buffer_type_t pinned;
    ggml_backend_dev_t dev;
    struct ggml_tensor *t;
    struct rates h2d, d2h, h2d_p, d2h_p;
    uint8_t *host = NULL;
    size_t n, max;
    int chunks, reps, rc = 1;

    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: h2d DIR DEVICE MiB CHUNKS [REPS]\n");
        return 2;
    }
    n = (size_t)strtoull(argv[3], NULL, 10) << 20;
    chunks = atoi(argv[4]);
    reps = argc > 5 ? atoi(argv[5]) : 3;
    if (n == 0 || chunks < 1 || reps < 1) {
        fprintf(stderr, "h2d: MiB, CHUNKS and REPS must be positive\n");
        return 2;
    }
    ggml_backend_load_all_from_path(argv[1]);
    if (!(dev = ggml_backend_dev_by_name(argv[2]))) {
        fprintf(stderr, "h2d: no device %s among the backends in %s\n", argv[2], argv[1]);
        return 1;
    }
    max = ggml_backend_buft_get_max_size(ggml_backend_dev_buffer_type(dev));
    if (n > max) /* a Vulkan device caps one allocation */
        n = max & ~(size_t)((1 << 20) - 1);

    struct ggml_init_params ip = {ggml_tensor_overhead() + 64, NULL, true};
    if (!(ctx = ggml_init(ip)))
        goto out;
    t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t)n);
    if (!(dbuf = ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), n))) {
        fprintf(stderr, "h2d: cannot allocate %zu MiB on %s\n", n >> 20, argv[2]);
        goto free_ctx;
    }
    if (ggml_backend_tensor_alloc(dbuf, t, ggml_backend_buffer_get_base(dbuf)) != GGML_STATUS_SUCCESS)
        goto free_dbuf;
    if (!(host = malloc(n)))
        goto free_dbuf;
    memset(host, 0x5a, n); /* touched: no page faults inside the timed copies */
    h2d = measure(t, host, n, chunks, reps, 1);
    d2h = measure(t, host, n, chunks, reps, 0);
    pinned = ggml_backend_dev_host_buffer_type(dev);
    if (pinned && (pbuf = ggml_backend_buft_alloc_buffer(pinned, n))) {
        uint8_t *p = ggml_backend_buffer_get_base(pbuf);
        memset(p, 0x5a, n);
        h2d_p = measure(t, p, n, chunks, reps, 1);
        d2h_p = measure(t, p, n, chunks, reps, 0);
    }
    printf("{\"device\": \"");
    print_str(argv[2]);
    printf("\", \"description\": \"");
    print_str(ggml_backend_dev_description(dev));
    printf("\", \"bytes\": %zu, \"chunks\": %d", n, chunks);
    print_rates("h2d", &h2d);
    print_rates("d2h", &d2h);
    print_rates("h2d_pinned", pbuf ? &h2d_p : NULL);
    print_rates("d2h_pinned", pbuf ? &d2h_p : NULL);
    printf("}\n");
    rc = 0;
    if (pbuf)
        ggml_backend_buffer_free(pbuf);
    free(host);
free_dbuf:
    ggml_backend_buffer_free(dbuf);
free_ctx:
    ggml_free(ctx);
out:
    return rc;
}
