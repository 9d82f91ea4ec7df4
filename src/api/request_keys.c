/* request_keys.c — the keys of a request's conversation (request_keys.h). */
#include "api/request_keys.h"

#include "api/api.h"

#include <string.h>

long thaw_request_keys_last_assistant(const struct thaw_message *msgs, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (strcmp(msgs[i].role, "assistant") == 0)
            return (long)i;
    return -1;
}

void thaw_request_keys_conversation(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_message *msgs, size_t n,
                                    const char *extra_json, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, "thaw.kv.v2");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    /* the normalised message: role as the template sees it ("developer"
     * renders as "system"), content, tool calls, ids, names, reasoning */
    for (size_t i = 0; i < n; i++)
        thaw_keys_hash_field(&st, msgs[i].json);
    if (extra_json)
        thaw_keys_hash_field(&st, extra_json);
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_request_keys_bind(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                            uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, "thaw.request.v1");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, req->tools_json ? req->tools_json : "");
    thaw_keys_hash_field(&st, req->template_kwargs ? req->template_kwargs : "");
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}

void thaw_request_keys_reply(const uint8_t binding[THAW_KEY_BYTES], const struct thaw_chat_request *req,
                             const char *reply_json, const int32_t *tokens, int n_tokens, uint8_t out[THAW_KEY_BYTES])
{
    crypto_generichash_state st;

    if (!req->raw) {
        thaw_request_keys_conversation(binding, req->messages, thaw_chat_request_n_history(req), reply_json, out);
        return;
    }
    crypto_generichash_init(&st, NULL, 0, THAW_KEY_BYTES);
    thaw_keys_hash_field(&st, "thaw.kv.raw.v1");
    crypto_generichash_update(&st, binding, THAW_KEY_BYTES);
    for (int i = 0; i < n_tokens; i++) {
        uint8_t le[4] = {(uint8_t)tokens[i], (uint8_t)(tokens[i] >> 8), (uint8_t)(tokens[i] >> 16),
                         (uint8_t)(tokens[i] >> 24)};
        crypto_generichash_update(&st, le, sizeof le);
    }
    crypto_generichash_final(&st, out, THAW_KEY_BYTES);
}
