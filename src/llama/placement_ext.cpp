// placement_ext.cpp — the two reads placement.c needs that libllama offers
// in C++ only: the model's tensors by name (llama-model.h's
// llama_internal_get_tensor_map) and the context's memory per buffer type
// (llama-ext.h's llama_get_memory_breakdown). Both in llama.cpp v0.4.0's
// libllama; neither throws through to C.
#include <src/llama-ext.h>

#include <string>
#include <utility>
#include <vector>

// declared in llama.cpp's src/llama-model.h, which pulls in the whole model
const std::vector<std::pair<std::string, ggml_tensor *>> & llama_internal_get_tensor_map(const llama_model * model);

extern "C" void thaw_placement_each_tensor(const struct llama_model *model,
                                           void (*fn)(void *ud, const char *name, const struct ggml_tensor *t),
                                           void *ud);
extern "C" void thaw_placement_each_buffer(const struct llama_context *ctx,
                                           void (*fn)(void *ud, ggml_backend_buffer_type_t buft, size_t model,
                                                      size_t context, size_t compute),
                                           void *ud);

extern "C" void thaw_placement_each_tensor(const struct llama_model *model,
                                           void (*fn)(void *ud, const char *name, const struct ggml_tensor *t),
                                           void *ud)
{
    for (const auto &[name, t] : llama_internal_get_tensor_map(model))
        fn(ud, name.c_str(), t);
}

extern "C" void thaw_placement_each_buffer(const struct llama_context *ctx,
                                           void (*fn)(void *ud, ggml_backend_buffer_type_t buft, size_t model,
                                                      size_t context, size_t compute),
                                           void *ud)
{
    try {
        for (const auto &[buft, mb] : llama_get_memory_breakdown(ctx))
            fn(ud, buft, mb.model, mb.context, mb.compute);
    } catch (...) {
        // std::map's allocation failed: the bytes stay unknown (0)
    }
}
