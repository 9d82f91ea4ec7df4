/* placement.h — where a loaded model and its context sit: for each device
 * and for host memory, the layers whose weights are there, and the bytes
 * of weights, KV cache and compute buffers, as llama.cpp placed them
 * (-ngl, -dev, -ot, -ncmoe, -nkvo, -ts, -fit). Read once, after the
 * context exists: nothing moves afterwards.
 *
 * A place is host memory (index 0, always) or one GPU device of ggml's
 * (every one the backends offer, used or not, in ggml's order). Host
 * memory is every buffer the CPU reads directly: the CPU's own (mapped,
 * repacked), an accelerator's beside it (BLAS), a GPU's pinned host
 * buffers. A layer is at a place when all of its weights are; one whose
 * weights span places (-ot, -ncmoe) is split. The KV cache's bytes are
 * llama.cpp's "context" memory: KV cells and recurrent state.
 */
#ifndef THAW_PLACEMENT_H
#define THAW_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct llama_model;
struct llama_context;

#define THAW_PLACES_MAX 17    /* the host and up to 16 devices */
#define THAW_PLACE_SPLIT (-1) /* thaw_placement.layer_place: weights in more than one place */
#define THAW_PLACE_NONE (-2)  /* a layer with no weights (none are known to llama.cpp) */

struct thaw_place {
    char name[64];          /* the device's ("Vulkan0", "CUDA0"), or "host" */
    char desc[128];         /* the device's description; "" for the host */
    bool host;              /* host memory (see above) */
    uint64_t mem_total;     /* the device's memory, bytes; 0 for the host */
    uint64_t mem_free;      /* of it, free once the model and context are in, bytes */
    uint64_t weights_bytes; /* model weights in this place's buffers */
    uint64_t kv_bytes;      /* the KV cache (and recurrent state) */
    uint64_t compute_bytes; /* the context's compute buffers */
    int n_layers;           /* layers whose every weight is here */
    bool output;            /* the output layer's weights (output.weight, or the tied embedding) are here */
};

/* Caller storage: thaw_placement_init fills it, thaw_placement_free
 * releases what it allocated. */
struct thaw_placement {
    int n_places; /* >= 1: [0] is the host */
    struct thaw_place places[THAW_PLACES_MAX];
    int n_layer;         /* the model's blocks */
    int8_t *layer_place; /* [n_layer]: index into places, or THAW_PLACE_SPLIT / _NONE */
};

/* Reads where llama.cpp put `model`'s weights and `ctx`'s buffers. Returns
 * 0 or THAW_ENOMEM (nothing left allocated). */
int thaw_placement_init(struct thaw_placement *p, const struct llama_model *model, const struct llama_context *ctx);

/* Frees the layer table; *p may be zeroed or already freed. */
void thaw_placement_free(struct thaw_placement *p);

/* One INFO line per place that holds something or is a device ("placement:
 * Vulkan0 (llvmpipe ..., 2048 MiB, 2020 MiB free): layers 0-1 of 2,
 * output; weights 12.0 MiB, KV cache 8.0 MiB, compute 4.1 MiB"), and one
 * naming split layers if any. */
void thaw_placement_log(const struct thaw_placement *p);

/* Writes into out (cap bytes, NUL-terminated, cut to fit) the layers at
 * place `i` as ranges ("0-3,7"); "" for none. */
void thaw_placement_layers(const struct thaw_placement *p, int i, char *out, size_t cap);

/* Writes where the KV cache sits: the places holding any of it joined by
 * '+' ("Vulkan0", "host", "Vulkan0+host"), "none" for a model with no KV
 * cache. Same out/cap rules. */
void thaw_placement_kv(const struct thaw_placement *p, char *out, size_t cap);

#endif
