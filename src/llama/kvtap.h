/* kvtap.h — cut a slot's blocks straight out of libllama's KV cache.
 *
 * libllama (v0.4.0) hands out a sequence's state only whole
 * (llama_state_seq_get_data), so a store that writes only the blocks a
 * turn added still copied the whole conversation on the engine thread
 * first: the store of a 250-token turn cost 4.8x more on a 16k-token
 * history than on a 2k one. The tap finds out, from the graphs libllama
 * computes, where each layer's cache lives and which cell each decoded
 * position went to, so the blocks a store needs are cut from the cache's
 * own memory — O(new tokens), whatever the history.
 *
 * How it sees: it is the scheduler's eval callback
 * (llama_context_params.cb_eval). It is asked about every node before the
 * node is computed and never asks to observe one, so the graph still
 * computes in one piece as without it. It looks at:
 *   - SET_ROWS nodes that write into a tensor named cache_k_l<i> or
 *     cache_v_l<i> (the KV cache's own tensors, llama-kv-cache.cpp):
 *     layer i's memory; for K, the index input gives the cell of each of the
 *     ubatch's tokens (stream * kv_size + cell, set before compute). An
 *     MLA model (deepseek2) has cache_k_l<i> only — its V is a view of the
 *     latent K — and its state no V parts: the tap cuts K rows only;
 *   - the ROPE node before it: the same tokens' positions (inp_pos).
 * Cutting from that memory writes the same bytes as cutting a capture
 * (kvlayout.h); thaw_kvtap_selftest checks it at start-up on a real decode
 * and the test setting THAW_TEST_KVTAP_VERIFY=1 checks it on every store.
 *
 * What it cannot see it does not guess: a position is known once decoded
 * and forgotten when the engine removes it (thaw_kvtap_forget); a restored
 * state is known once its first and last cells match the state installed
 * (thaw_kvtap_restored: libllama installs a state into one run of cells).
 * A store that needs an unknown cell gets THAW_ENOTFOUND and captures the
 * whole state as before.
 *
 * Sliding-window (iSWA) models have a second cache for their SWA layers
 * that holds only n_swa + n_ubatch cells: a block's SWA rows are gone from
 * it long before the store that needs them. The tap asks the scheduler to
 * show it each SWA layer's V write once computed (the only nodes it asks
 * for; the graph then computes in one piece per SWA layer) and copies the
 * ubatch's K and V rows of that layer into a shadow laid out by position,
 * from which SWA blocks are cut (DESIGN §12). Installed states give the
 * shadow their window. Costs host memory as --swa-full's cache would.
 *
 * Host memory or a device's (a GPU backend): on a device the row indices
 * and positions are read once the ubatch's first K write computed, the SWA
 * layers' rows once both their K and V writes computed (a backend may
 * reorder the graph), and a store's rows through ggml_backend_tensor_get:
 * each token's rows cross from the device once, when stored or (SWA) when
 * written. The self-test refuses recurrent and M-RoPE layouts, and an SWA
 * cache as large as the base one. Engine thread only (the callback runs on
 * the thread that calls llama_decode).
 */
#ifndef THAW_KVTAP_H
#define THAW_KVTAP_H

#include <ggml.h>
#include <llama.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct thaw_kvtap;

int thaw_kvtap_new(struct thaw_kvtap **out);
void thaw_kvtap_free(struct thaw_kvtap *t);

/* llama_context_params.cb_eval, with the tap as cb_eval_user_data. */
bool thaw_kvtap_eval_cb(struct ggml_tensor *node, bool ask, void *ud);

/* Decodes a few tokens into seq (a spare, empty sequence of ctx), captures
 * its state and checks that blocks cut from the cache's memory equal blocks
 * cut from the capture. seq is left empty. 0: the tap is ready;
 * THAW_ELAYOUT: it cannot be used (`why`, one line); THAW_ELLAMA, THAW_ENOMEM. */
int thaw_kvtap_selftest(struct thaw_kvtap *t, struct llama_context *ctx, llama_seq_id seq, char *why, size_t n_why);

/* 1 when some layer's KV cache is in device memory (learnt from the
 * graphs: after the first decode). */
int thaw_kvtap_device(const struct thaw_kvtap *t);

/* Bytes the tap read from device memory so far (its cuts and SWA rows):
 * thaw_kv_device_to_host_bytes_total's part from the tap. */
uint64_t thaw_kvtap_device_bytes(const struct thaw_kvtap *t);

/* 1 once the self-test passed and nothing disabled the tap since. */
int thaw_kvtap_ready(const struct thaw_kvtap *t);

/* The engine removed seq's positions >= from_pos (0: all of them). */
void thaw_kvtap_forget(struct thaw_kvtap *t, llama_seq_id seq, int from_pos);

/* The engine installed `state` (llama_state_seq_set_data's input, n_state
 * bytes) into seq: its cells are known if its first and last cells are
 * where a fresh install puts them. With a cache in device memory and
 * block_tokens > 0 (the store's blocks), the state's partial last block
 * is kept as the stream's last cut, so the next store reads only the
 * cells past it from the device. */
void thaw_kvtap_restored(struct thaw_kvtap *t, llama_seq_id seq, const void *state, size_t n_state,
                         uint32_t block_tokens);

/* 1 if positions [a, b) of seq are known. */
int thaw_kvtap_known(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b);

/* The kvlayout block of seq's positions [a, b): its size, and the cut (0,
 * THAW_ENOTFOUND: a position unknown, THAW_ETOOBIG, THAW_EINVAL). */
size_t thaw_kvtap_block_size(const struct thaw_kvtap *t, uint32_t a, uint32_t b);
int thaw_kvtap_cut(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b, void *dst, size_t cap);

/* SWA rows (iSWA models): 1 when the tap cuts them (ready, with an SWA
 * cache); whether positions [a, b) of seq are in the shadow; the size of
 * the SWA block of [a, b); the cut (0, THAW_ENOTFOUND, THAW_ETOOBIG,
 * THAW_EINVAL). */
int thaw_kvtap_has_swa(const struct thaw_kvtap *t);
int thaw_kvtap_swa_known(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b);
size_t thaw_kvtap_swa_block_size(const struct thaw_kvtap *t, uint32_t a, uint32_t b);
int thaw_kvtap_swa_cut(const struct thaw_kvtap *t, llama_seq_id seq, uint32_t a, uint32_t b, void *dst, size_t cap);

/* THAW_TEST_KVTAP_VERIFY (testhooks.h): captures seq's whole state (n_tokens cells) and
 * compares the tap's cut of every known block of block_tokens cells, and
 * of the rest, with the capture's. 0 when all match (or nothing was
 * known); THAW_EMISMATCH (logged, and the tap is disabled) otherwise. */
int thaw_kvtap_verify(struct thaw_kvtap *t, struct llama_context *ctx, llama_seq_id seq, int n_tokens,
                      uint32_t block_tokens);

#endif
