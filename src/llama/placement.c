/* placement.c — where llama.cpp put a model and its context (placement.h).
 *
 * Map:
 *   places      host memory and each GPU device, a buffer type's place
 *   reading     thaw_placement_init: weights by tensor, bytes by buffer type
 *   text        layer ranges, the KV cache's places, the start-up log
 */
#include "llama/placement.h"

#include "base/error.h"
#include "base/fmt.h"
#include "base/log.h"

#include <ggml-backend.h>
#include <ggml.h>
#include <inttypes.h>
#include <llama.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* placement_ext.cpp */
void thaw_placement_each_tensor(const struct llama_model *model,
                                void (*fn)(void *ud, const char *name, const struct ggml_tensor *t), void *ud);
void thaw_placement_each_buffer(const struct llama_context *ctx,
                                void (*fn)(void *ud, ggml_backend_buffer_type_t buft, size_t model, size_t context,
                                           size_t compute),
                                void *ud);

/* ---- places ----------------------------------------------------------------------- */

static bool dev_is_host(ggml_backend_dev_t dev)
{
    enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    return t == GGML_BACKEND_DEVICE_TYPE_CPU || t == GGML_BACKEND_DEVICE_TYPE_ACCEL;
}

/* The place a buffer type's memory is in: 0 (host) for the CPU's, an
 * accelerator's, and any buffer type the CPU reads directly (a GPU's pinned
 * host memory); else the index of its device's place; -1 if unknown. */
static int place_of_buft(const struct thaw_placement *p, ggml_backend_buffer_type_t buft)
{
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);

    if (!dev || dev_is_host(dev) || ggml_backend_buft_is_host(buft))
        return 0;
    for (int i = 1; i < p->n_places; i++)
        if (strcmp(p->places[i].name, ggml_backend_dev_name(dev)) == 0)
            return i;
    return -1;
}

static void add_devices(struct thaw_placement *p)
{
    snprintf(p->places[0].name, sizeof p->places[0].name, "host");
    p->places[0].host = true;
    p->n_places = 1;
    for (size_t i = 0; i < ggml_backend_dev_count() && p->n_places < THAW_PLACES_MAX; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (dev_is_host(dev))
            continue;
        struct thaw_place *pl = &p->places[p->n_places++];
        size_t free_b = 0, total_b = 0;
        snprintf(pl->name, sizeof pl->name, "%s", ggml_backend_dev_name(dev));
        snprintf(pl->desc, sizeof pl->desc, "%s", ggml_backend_dev_description(dev));
        ggml_backend_dev_memory(dev, &free_b, &total_b);
        pl->mem_total = total_b;
        pl->mem_free = free_b;
    }
}

/* ---- reading ---------------------------------------------------------------------- */

struct tensor_walk {
    struct thaw_placement *p;
    int output;      /* place of output.weight, -1 = not seen */
    int tied_device; /* place of a copy of token_embd.weight off the host, -1 = none */
};

static void on_tensor(void *ud, const char *name, const struct ggml_tensor *t)
{
    struct tensor_walk *w = ud;
    struct thaw_placement *p = w->p;
    int il;
    int n = 0;

    if (!t->buffer)
        return; /* not allocated (an unused tensor) */
    int at = place_of_buft(p, ggml_backend_buffer_get_type(t->buffer));
    if (sscanf(name, "blk.%d.%n", &il, &n) == 1 && n > 0) {
        if (il < 0 || il >= p->n_layer)
            return; /* a NextN / MTP block past the trunk */
        int8_t *lp = &p->layer_place[il];
        if (*lp == THAW_PLACE_NONE)
            *lp = (int8_t)(at < 0 ? THAW_PLACE_SPLIT : at);
        else if (*lp != at)
            *lp = THAW_PLACE_SPLIT;
    } else if (strcmp(name, "output.weight") == 0) {
        w->output = at;
    } else if (strcmp(name, "token_embd.weight") == 0 && at > 0) {
        w->tied_device = at; /* the embedding duplicated as the output on a device */
    }
}

static void on_buffer(void *ud, ggml_backend_buffer_type_t buft, size_t model, size_t context, size_t compute)
{
    struct thaw_placement *p = ud;
    int at = place_of_buft(p, buft);
    struct thaw_place *pl = &p->places[at < 0 ? 0 : at];

    pl->weights_bytes += model;
    pl->kv_bytes += context;
    pl->compute_bytes += compute;
}

int thaw_placement_init(struct thaw_placement *p, const struct llama_model *model, const struct llama_context *ctx)
{
    struct tensor_walk w = {p, -1, -1};

    memset(p, 0, sizeof *p);
    add_devices(p);
    p->n_layer = llama_model_n_layer(model);
    if (p->n_layer > 0 && !(p->layer_place = malloc((size_t)p->n_layer)))
        return THAW_ENOMEM;
    for (int i = 0; i < p->n_layer; i++)
        p->layer_place[i] = THAW_PLACE_NONE;
    thaw_placement_each_tensor(model, on_tensor, &w);
    thaw_placement_each_buffer(ctx, on_buffer, p);
    for (int i = 0; i < p->n_layer; i++)
        if (p->layer_place[i] >= 0)
            p->places[p->layer_place[i]].n_layers++;
    /* no output.weight: the head is the embedding, tied (a copy on a
     * device when the output layer is offloaded, else the input's own) */
    int out = w.output >= 0 ? w.output : w.tied_device >= 0 ? w.tied_device : 0;
    p->places[out].output = true;
    /* the devices' memory once everything is in */
    for (int i = 1; i < p->n_places; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(p->places[i].name);
        size_t free_b = 0, total_b = 0;
        if (dev) {
            ggml_backend_dev_memory(dev, &free_b, &total_b);
            p->places[i].mem_free = free_b;
        }
    }
    return 0;
}

void thaw_placement_free(struct thaw_placement *p)
{
    free(p->layer_place);
    p->layer_place = NULL;
}

/* ---- text ------------------------------------------------------------------------- */

void thaw_placement_layers(const struct thaw_placement *p, int i, char *out, size_t cap)
{
    size_t len = 0;

    if (cap == 0)
        return;
    out[0] = '\0';
    for (int il = 0; il < p->n_layer; il++) {
        if (p->layer_place[il] != i)
            continue;
        int last = il;
        while (last + 1 < p->n_layer && p->layer_place[last + 1] == i)
            last++;
        int w = last > il ? snprintf(out + len, cap - len, "%s%d-%d", len ? "," : "", il, last)
                          : snprintf(out + len, cap - len, "%s%d", len ? "," : "", il);
        if (w < 0 || (size_t)w >= cap - len) {
            out[len] = '\0'; /* cut at a whole range */
            return;
        }
        len += (size_t)w;
        il = last;
    }
}

void thaw_placement_kv(const struct thaw_placement *p, char *out, size_t cap)
{
    size_t len = 0;

    if (cap == 0)
        return;
    out[0] = '\0';
    /* devices first: "Vulkan0+host" */
    for (int k = 1; k <= p->n_places; k++) {
        int i = k % p->n_places;
        if (p->places[i].kv_bytes == 0)
            continue;
        int w = snprintf(out + len, cap - len, "%s%s", len ? "+" : "", p->places[i].name);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
    }
    if (len == 0)
        snprintf(out, cap, "none");
}

void thaw_placement_log(const struct thaw_placement *p)
{
    char layers[256], what[300], wb[24], kb[24], cb[24], dev[256] = "";
    int n_split = 0;

    for (int k = 1; k <= p->n_places; k++) {
        int i = k % p->n_places; /* the devices, then the host */
        const struct thaw_place *pl = &p->places[i];
        if (pl->host && pl->weights_bytes == 0 && pl->kv_bytes == 0 && pl->compute_bytes == 0 && pl->n_layers == 0)
            continue;
        if (!pl->host)
            snprintf(dev, sizeof dev, " (%s, %" PRIu64 " MiB, %" PRIu64 " MiB free)", pl->desc, pl->mem_total >> 20,
                     pl->mem_free >> 20);
        else
            dev[0] = '\0';
        thaw_placement_layers(p, i, layers, sizeof layers);
        if (pl->n_layers == 0)
            snprintf(what, sizeof what, "no layers");
        else
            snprintf(what, sizeof what, "%s %s of %d", pl->n_layers == 1 ? "layer" : "layers", layers, p->n_layer);
        thaw_fmt_bytes(pl->weights_bytes, wb);
        thaw_fmt_bytes(pl->kv_bytes, kb);
        thaw_fmt_bytes(pl->compute_bytes, cb);
        LOG_INF("placement: %s%s: %s%s; weights %s, KV cache %s, compute %s", pl->name, dev, what,
                pl->output ? ", output" : "", wb, kb, cb);
    }
    for (int il = 0; il < p->n_layer; il++)
        n_split += p->layer_place[il] == THAW_PLACE_SPLIT;
    if (n_split > 0) {
        thaw_placement_layers(p, THAW_PLACE_SPLIT, layers, sizeof layers);
        LOG_INF("placement: %s %s split between places (tensor overrides: -ot, -ncmoe)",
                n_split == 1 ? "layer" : "layers", layers);
    }
}
