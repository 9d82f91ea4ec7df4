/* config.c — the serve config's defaults, and freeing what parsing
 * allocated (the flag table and its parser are cli/config.c's). */
#include "base/config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void thaw_config_init(struct thaw_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_ctx = 4096;
    cfg->n_parallel = 1;
    cfg->models_max = 4; /* llama-server's */
    cfg->models_autoload = true;
    cfg->sleep_idle_s = -1; /* llama-server's: disabled */
    cfg->n_threads = 0; /* resolved after parsing: number of CPUs */
    cfg->n_threads_batch = 0;
    cfg->cpu.poll = 50; /* llama-server's */
    cfg->cpu_batch.prio = cfg->cpu_batch.poll = cfg->cpu_batch.strict = INT_MIN; /* unset: same as cfg->cpu */
    cfg->n_batch = 2048;
    cfg->n_ubatch = 512;
    cfg->n_predict = -1;
    cfg->pooling = -1; /* LLAMA_POOLING_TYPE_UNSPECIFIED: the model's */
    cfg->embd_normalize = 2;
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->slot_prompt_similarity = 0.1f;
    cfg->fixup_wait_ms = 250;
    cfg->shutdown_timeout_s = 8;
    cfg->cache_prompt = true;
    cfg->webui = true;
    cfg->max_queue = 64;
    cfg->max_body = 16u << 20;
    cfg->threads_http = 4;
    cfg->max_connections = 4096;
    cfg->max_per_client = 64;
    cfg->timeout_s = 30;
    cfg->kv_cache_ttl_s = 259200;
    cfg->kv_cache_min_tokens = 256;
    cfg->kv_cache_queue_mib = 1024;
    cfg->kv_cache_block = 128;
    cfg->cache_ram_mib = 8192;
    cfg->ctx_checkpoints = 8;
    cfg->checkpoint_every = 4096;
    cfg->kv_snapshot_idle_s = 300;
    cfg->kv_shared_timeout_ms = 2000;
    cfg->kv_shared_retry_s = 30;
    cfg->kv_shared_queue = 64;
    cfg->verbosity = 1;
    cfg->jinja = true;
    cfg->kv_tap = true;
    cfg->reasoning_format = "auto";
    cfg->reasoning_budget = -1;
    cfg->reasoning_preserve = true;
    cfg->prefill_assistant = true;
    cfg->slots = true;
    cfg->metrics = true;
    cfg->sse_ping_s = 30;
    cfg->api_prefix = "";
    cfg->draft_max = 16;
    cfg->draft_min = 0;
    cfg->draft_p_min = 0.75f;
    /* llama-server's n-gram defaults (common/common.h) */
    for (int k = THAW_SPEC_NGRAM_SIMPLE; k <= THAW_SPEC_NGRAM_MAP_K4V; k++)
        cfg->spec_ngram[k] = (struct thaw_spec_ngram){.size_n = 12, .size_m = 48, .min_hits = 1, .n_min = 1};
    cfg->spec_ngram[THAW_SPEC_NGRAM_MOD] = (struct thaw_spec_ngram){.size_n = 24, .size_m = 64, .min_hits = 1, .n_min = 48};
    /* llama-server's defaults (common/common.h) */
    cfg->n_gpu_layers = -1;
    cfg->draft_n_gpu_layers = -1;
    cfg->split_mode = 1; /* LLAMA_SPLIT_MODE_LAYER */
    cfg->kv_offload = true;
    cfg->mmproj_offload = true;
    cfg->op_offload = true;
    cfg->load_mode = -1; /* LLAMA_LOAD_MODE_AUTO */
    cfg->lazy_mode = 1;  /* LLAMA_LAZY_MODE_AUTO */
    cfg->repack = true;
    cfg->fit = true;
    for (int i = 0; i < THAW_MAX_DEVICES; i++)
        cfg->fit_target_mib[i] = 1024;
    cfg->fit_ctx = 4096;
    cfg->flash_attn = -1;         /* LLAMA_FLASH_ATTN_TYPE_AUTO */
    cfg->type_k = 1; /* GGML_TYPE_F16 (cli/config.c checks the value) */
    cfg->type_v = 1;
    cfg->draft_type_k = 1;
    cfg->draft_type_v = 1;
    cfg->rope_scaling = -1;       /* LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED */
    cfg->yarn_ext_factor = -1.0f;
    cfg->yarn_attn_factor = -1.0f;
    cfg->yarn_beta_fast = -1.0f;
    cfg->yarn_beta_slow = -1.0f;
    thaw_sampling_default(&cfg->sampling);
    cfg->log_colors = -1;
    cfg->log_prefix = true;
    cfg->log_timestamps = true;
}

void thaw_config_free(struct thaw_config *cfg)
{
    for (int i = 0; i < 3; i++) {
        free(cfg->file_texts[i]);
        cfg->file_texts[i] = NULL;
    }
    for (int i = 0; i < 2; i++) {
        free(cfg->tls_texts[i]);
        cfg->tls_texts[i] = NULL;
    }
    free(cfg->chat_template_text);
    cfg->chat_template_text = NULL;
    free(cfg->kwargs_text);
    cfg->kwargs_text = NULL;
    for (int i = 0; i < cfg->n_api_keys; i++)
        free((char *)cfg->api_keys[i]);
    cfg->n_api_keys = 0;
    for (int i = 0; i < cfg->n_presets; i++) {
        thaw_config_free(cfg->presets[i].cfg);
        free(cfg->presets[i].cfg);
    }
    free(cfg->presets);
    cfg->presets = NULL;
    cfg->n_presets = 0;
    if (cfg->preset_base)
        thaw_config_free(cfg->preset_base);
    free(cfg->preset_base);
    cfg->preset_base = NULL;
    free(cfg->preset_text); /* after the configs whose strings point into it */
    cfg->preset_text = NULL;
}
