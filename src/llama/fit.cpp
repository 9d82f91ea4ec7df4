// fit.cpp — the one call into llama.cpp's common_fit_params (C++), for params.c.
#include <common/fit.h>

extern "C" int thaw_fit_call(const char *path_model, struct llama_model_params *mp, struct llama_context_params *cp,
                             float *tensor_split, struct llama_model_tensor_buft_override *overrides, size_t *margins,
                             uint32_t n_ctx_min, int debug);

/* Returns 0 (fits), 1 (could not find a fit) or 2 (error); never throws. */
extern "C" int thaw_fit_call(const char *path_model, struct llama_model_params *mp, struct llama_context_params *cp,
                             float *tensor_split, struct llama_model_tensor_buft_override *overrides, size_t *margins,
                             uint32_t n_ctx_min, int debug)
{
    try {
        return (int)common_fit_params(path_model, mp, cp, tensor_split, overrides, margins, n_ctx_min, nullptr,
                                      debug ? GGML_LOG_LEVEL_DEBUG : GGML_LOG_LEVEL_ERROR);
    } catch (...) {
        return 2;
    }
}
