/* kvlayout.h — libllama's sequence-state layout: parse it, cut it into
 * blocks of cells, assemble it back from blocks (DESIGN §9).
 *
 * libllama restores a sequence only from one buffer in its own layout
 * (llama_state_seq_set_data). That layout belongs to the pinned version
 * (llama.cpp v0.4.0, src/llama-kv-cache.cpp state_write*); this module is
 * the only place in thaw that knows it. Anything it does not recognise is
 * THAW_ELAYOUT, and the caller keeps whole-state entries (§2) instead.
 *
 * ---- the libllama buffer (host byte order), as this module reads it ----
 *
 *   u32 magic 0xaf143cd8 | i32 seq_id
 *   section 0: the attention KV cache (full-attention layers) — CUT
 *   section 1: optional, the SWA KV cache of an iSWA model — the TAIL:
 *              it holds only the window (n_swa + n_ubatch cells at most, in
 *              cell order, positions not from 0), so it is not cut like
 *              section 0; its rows are cut by position into SWA blocks
 *              (thaw_kvlayout_swa_*, DESIGN §12) while they are in it, and
 *              a restore reads them into place (thaw_kvlayout_asm_swa);
 *              or the recurrent state of a hybrid model (its attention
 *              layers are section 0) — also the TAIL, kept whole: it
 *              exists only at the sequence's last position (snapshots.h)
 *
 *   a section (one llama_kv_cache):
 *     u32 n_stream                  (n_seq_max when kv_unified is off)
 *     n_stream x { u32 n_cells; when n_cells > 0 (exactly one stream):
 *       meta  n_cells x { i32 pos | u32 n_seq_id (1) | [ext: i32 x, i32 y,
 *                         i32 tok, M-RoPE / PLE models] | i32 seq_id }
 *       u32 v_trans | u32 n_layers
 *       K     n_layers x { i32 type | u64 row (bytes per cell) |
 *                          u8 rows[n_cells][row] }
 *       V     v_trans 0: n_layers x { i32 type | u64 row | u8 rows[n_cells][row] }
 *             v_trans 1: n_layers x { i32 type | u32 el (type size) |
 *                          u32 n_embd_v | u8 cols[n_embd_v][n_cells][el] }
 *             absent in a cache without V tensors (MLA models, deepseek2:
 *             K is the latent, V a view of it; v_trans is still written) }
 *
 * Supported: one or two sections as above; any stream count with exactly one
 * stream holding cells; cells with or without ext; V per row (flash
 * attention), transposed or absent (K only: told from the state itself —
 * a buffer that parses only without V parts is one, and both sections
 * then have none); any ggml type with a known size (quantised types
 * only untransposed). Section 0's cells must hold positions 0..n-1 in order
 * (a thaw slot's sequence does).
 * Refused (THAW_ELAYOUT): a different magic, more than one stream with cells,
 * a purely recurrent memory (no attention section),
 * a hybrid whose recurrent head is not one cell at the last position,
 * unknown types or row sizes, positions out of order, any bytes left over.
 *
 * ---- a block (this module's own format, host byte order = little-endian) --
 *
 *   off  0  u32 magic "TKB1"
 *        4  u16 version (1) | u16 flags (1: V transposed, 2: cells carry ext,
 *                                        4: K only, no V part: MLA)
 *        8  u32 pos0          position of the first cell
 *       12  u32 n_cells
 *       16  u32 n_layers
 *       20  u32 reserved (0)
 *       24  n_layers x { i32 k_type | i32 v_type | u64 k_row | u64 v_row }
 *                      rows in bytes per cell; transposed V: v_row =
 *                      n_embd_v * type size; K only: v_type 0, v_row 0
 *           meta  n_cells x { i32 pos [| i32 x | i32 y | i32 tok] }
 *           K     per layer: u8 rows[n_cells][k_row]
 *           V     per layer, untransposed: u8 rows[n_cells][v_row]
 *                            transposed:   u8 cols[n_embd_v][n_cells][el]
 *                 none when K only (flag 4 also keeps these blocks from
 *                 ever assembling with blocks that have V)
 *
 * A block holds no sequence id, stream or slot: the same cells cut from any
 * slot give the same bytes, so blocks can be shared between conversations.
 * Those belong to the frame, given back at assembly.
 *
 * Every length is checked against its buffer before it is read: a damaged
 * buffer or block is THAW_ECORRUPT (or THAW_ELAYOUT where the damage looks
 * like another layout), never an overread.
 */
#ifndef THAW_KVLAYOUT_H
#define THAW_KVLAYOUT_H

#include "base/token.h"
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct llama_context; /* llama.h */
struct ggml_tensor;   /* ggml.h */

#define THAW_KVLAYOUT_BLOCK_VERSION 1

/* A parsed state buffer. Opaque; it points into the buffer it was parsed
 * from, which must outlive it and stay unchanged. */
struct thaw_kvlayout;

/* What is per-slot in a libllama buffer and absent from blocks. */
struct thaw_kvlayout_frame {
    int32_t seq_id;    /* written in the header and in every cell's meta */
    uint32_t n_stream; /* streams of the context (n_seq_max, kv not unified) */
    uint32_t stream;   /* the stream holding the cells, < n_stream */
};

/* Parses a llama_state_seq_get_data() buffer of n bytes. On success *out is
 * a new layout (free it with thaw_kvlayout_free). Returns 0,
 * THAW_ECORRUPT (a length in the cut section runs past the buffer),
 * THAW_ELAYOUT (a layout this module does not know, including bytes after the
 * cut section that are not exactly one SWA section — a cut-off tail reads as
 * such: fall back to whole-state entries), THAW_EINVAL (no
 * cells: nothing to cut) or THAW_ENOMEM. *out is NULL on failure. */
int thaw_kvlayout_parse(const void *buf, size_t n, struct thaw_kvlayout **out);

void thaw_kvlayout_free(struct thaw_kvlayout *l);

/* Cells (= tokens, positions 0..n-1) in section 0. */
uint32_t thaw_kvlayout_n_cells(const struct thaw_kvlayout *l);
uint32_t thaw_kvlayout_n_layers(const struct thaw_kvlayout *l);
int thaw_kvlayout_v_trans(const struct thaw_kvlayout *l);
/* 1 when the layers have no V part (an MLA model's latent cache). */
int thaw_kvlayout_k_only(const struct thaw_kvlayout *l);
/* Bytes of K and V per cell over all layers of section 0. */
size_t thaw_kvlayout_bytes_per_cell(const struct thaw_kvlayout *l);
void thaw_kvlayout_frame(const struct thaw_kvlayout *l, struct thaw_kvlayout_frame *f);
/* 1 when the tail is a hybrid model's recurrent state, 0 for an SWA
 * section or none. */
int thaw_kvlayout_recurrent(const struct thaw_kvlayout *l);
/* The uncut tail (the SWA section or recurrent state): *tail points into the parsed buffer,
 * *n_tail 0 when there is none. */
void thaw_kvlayout_tail(const struct thaw_kvlayout *l, const void **tail, size_t *n_tail);

/* Size in bytes of the block holding cells [a, b). 0 when the range is
 * invalid (a >= b or b > n_cells). */
size_t thaw_kvlayout_block_size(const struct thaw_kvlayout *l, uint32_t a, uint32_t b);

/* Writes the block of cells [a, b) into dst (cap bytes, at least
 * thaw_kvlayout_block_size()). Returns 0, THAW_EINVAL (bad range) or
 * THAW_ETOOBIG (cap too small). */
int thaw_kvlayout_cut(const struct thaw_kvlayout *l, uint32_t a, uint32_t b, void *dst, size_t cap);

/* ---- blocks cut straight from the KV cache's memory ----
 * kvtap.c finds where libllama keeps each layer's K and V cells; this
 * writes the same block bytes thaw_kvlayout_cut() would cut from a capture,
 * without capturing the rest of the sequence. The shape (types, row sizes,
 * V transposed or not) comes from a parsed capture of the same context. */
struct thaw_kvlayout_mem;

/* A cutter shaped as l's section 0 (cells without ext: THAW_ELAYOUT
 * otherwise). Its layers' memory is unset until thaw_kvlayout_mem_set.
 * 0, THAW_ELAYOUT or THAW_ENOMEM. */
int thaw_kvlayout_mem_new(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out);

/* ---- SWA rows (DESIGN §12) ----
 * An SWA block is a block (the format below) of section 1's layers for
 * positions [a, b). Its rows exist in libllama's memory only while [a, b)
 * is in the window, so they are cut as they are written (kvtap.c) or from
 * a capture's section 1 while it still holds them. */

/* 1 when l has a section after section 0 (an SWA section). */
int thaw_kvlayout_has_swa(const struct thaw_kvlayout *l);
/* Cells in the SWA section (0: none, or it holds no cells). */
uint32_t thaw_kvlayout_swa_n_cells(const struct thaw_kvlayout *l);
/* The lowest and highest position in the SWA section; THAW_ENOTFOUND if empty. */
int thaw_kvlayout_swa_pos_range(const struct thaw_kvlayout *l, int32_t *lo, int32_t *hi);
/* idx[i] (b - a entries) = the index in the SWA section of position a + i.
 * 0, or THAW_ENOTFOUND when one is not in it (idx then partly -1). */
int thaw_kvlayout_swa_find(const struct thaw_kvlayout *l, uint32_t a, uint32_t b, int32_t *idx);
/* A cutter shaped as the SWA section, memory unset (as thaw_kvlayout_mem_new). */
int thaw_kvlayout_mem_new_swa(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out);
/* A cutter over the capture's own SWA section: stream 0, cell = the index
 * thaw_kvlayout_swa_find gives. Valid while l's buffer lives. */
int thaw_kvlayout_swa_mem(const struct thaw_kvlayout *l, struct thaw_kvlayout_mem **out);
/* Copies cell i of the SWA section, layer `layer`: its K row to k_dst and
 * its V row to v_dst (transposed V: element e to v_dst + e * v_dst_stride). */
void thaw_kvlayout_swa_copy_cell(const struct thaw_kvlayout *l, uint32_t i, uint32_t layer, void *k_dst,
                                 void *v_dst, size_t v_dst_stride);
void thaw_kvlayout_mem_free(struct thaw_kvlayout_mem *m);
uint32_t thaw_kvlayout_mem_n_layers(const struct thaw_kvlayout_mem *m);
/* 1 when its layers have no V (their V memory is never read: pass NULL). */
int thaw_kvlayout_mem_k_only(const struct thaw_kvlayout_mem *m);
/* Layer `layer`'s bytes per cell (transposed V: n_embd_v * el) and V's
 * element size (transposed V only, else 0). */
void thaw_kvlayout_mem_rows(const struct thaw_kvlayout_mem *m, uint32_t layer, uint64_t *k_row, uint64_t *v_row,
                            uint32_t *v_el);
/* Where layer `layer`'s cells are: in stream s, cell c's K row at
 * k + s * k_ss + c * k_row; V's at v + s * v_ss + c * v_row, or, transposed,
 * element e of cell c at v + s * v_ss + e * v_stride + c * el. */
void thaw_kvlayout_mem_set(struct thaw_kvlayout_mem *m, uint32_t layer, const void *k, size_t k_ss, const void *v,
                           size_t v_ss, size_t v_stride);
/* As thaw_kvlayout_mem_set for a layer in device memory (ggml_backend_
 * buffer_is_host false): its rows are read through the backend
 * (ggml_backend_tensor_get), as much as the block needs, when the device
 * is idle (the engine thread, between decodes). */
void thaw_kvlayout_mem_set_device(struct thaw_kvlayout_mem *m, uint32_t layer, const struct ggml_tensor *k,
                                  const struct ggml_tensor *v, size_t v_stride);
/* Bytes read from device memory by the cuts so far. */
uint64_t thaw_kvlayout_mem_device_bytes(const struct thaw_kvlayout_mem *m);
size_t thaw_kvlayout_mem_block_size(const struct thaw_kvlayout_mem *m, uint32_t a, uint32_t b);
/* The block of positions [a, b), position a + i in cell cell[i] of stream
 * `stream`.
 * 0, THAW_EINVAL, THAW_ETOOBIG, THAW_ENOTFOUND (a cell is -1: unknown, or a
 * layer's memory unset). */
int thaw_kvlayout_mem_cut(const struct thaw_kvlayout_mem *m, uint32_t stream, uint32_t a, uint32_t b,
                          const int32_t *cell, void *dst, size_t cap);
/* thaw_kvlayout_mem_cut, the rows of positions [a, a + n_head) taken from
 * `head` instead: a block this memory cut earlier for [a, a + head_cells)
 * (n_head <= head_cells; cell[0 .. n_head) are then not read). A cut from
 * device memory so reads only the positions the head does not hold: a
 * store's last block, partial, is read once, not again when it fills. */
int thaw_kvlayout_mem_cut_after(const struct thaw_kvlayout_mem *m, uint32_t stream, uint32_t a, uint32_t b,
                                const int32_t *cell, const void *head, uint32_t head_cells, uint32_t n_head,
                                void *dst, size_t cap);

/* 1 if blob starts like a block (magic, and a header's length), else 0:
 * what it claims to be, not whether it is whole (thaw_kvlayout_block_info). */
int thaw_kvlayout_is_block(const void *blob, size_t n);

/* Reads a block's header: its first position and cell count. Returns 0 or
 * THAW_ECORRUPT / THAW_EVERSION (the whole block is validated). */
int thaw_kvlayout_block_info(const void *block, size_t n, uint32_t *pos0, uint32_t *n_cells);

/* Builds a libllama buffer from n_blocks blocks (block i: blocks[i],
 * sizes[i] bytes) that cover positions 0..N-1 in order, with the frame f and
 * the tail (NULL/0 for none) appended verbatim. For the blocks, frame and
 * tail of a parsed buffer the result is byte-identical to it.
 * On success *out is malloc'd (the caller free()s it) and *n_out its size.
 * Returns 0, THAW_ECORRUPT / THAW_EVERSION (a damaged block), THAW_EMISMATCH
 * (blocks of different shapes: layers, types, flags), THAW_EINVAL (no
 * blocks, a gap or overlap in positions, a stream outside the frame) or
 * THAW_ENOMEM. */
int thaw_kvlayout_assemble(const void *const *blocks, const size_t *sizes, int n_blocks,
                           const struct thaw_kvlayout_frame *f, const void *tail, size_t n_tail, void **out,
                           size_t *n_out);

/* thaw_kvlayout_assemble with `headroom` bytes before the state in the
 * same allocation (left uninitialised, for the caller's header): *out is
 * the allocation, the state starts at (char *)*out + headroom, and *n_out
 * is the state's size without the headroom. */
int thaw_kvlayout_assemble_ex(const void *const *blocks, const size_t *sizes, int n_blocks,
                              const struct thaw_kvlayout_frame *f, const void *tail, size_t n_tail, size_t headroom,
                              void **out, size_t *n_out);

/* ---- assembly straight into place ----
 * For a restore that reads blocks from files: the state buffer is laid out
 * from the first block's head, then each block's head is checked and its
 * cell meta written, and thaw_kvlayout_asm_segments() says where the
 * block's data bytes go — in the order the block file holds them, so one
 * preadv per block scatters it into place and a checksum of the head then
 * the segments in order is the checksum of the file. */
struct thaw_kvlayout_asm;

/* Where a block's segments stand; start from all zero. */
struct thaw_kvlayout_cursor {
    uint32_t part, l, j;
};

/* From a block file's first 24 bytes (n >= 24): the size of its head
 * (header, layer table and cell meta), read before its data. 0,
 * THAW_ECORRUPT or THAW_EVERSION. */
int thaw_kvlayout_block_head_size(const void *hdr, size_t n, size_t *n_head);

/* Lays out a state of n_cells cells (the blocks to come cover positions
 * 0..n_cells-1 in order) shaped as the block whose head is head0 (at least
 * its head), for frame f, with n_tail bytes of tail (the SWA section) and
 * `headroom` bytes before the state. 0, THAW_ECORRUPT / THAW_EVERSION,
 * THAW_EINVAL or THAW_ENOMEM. */
int thaw_kvlayout_asm_new(const void *head0, size_t n_head0, uint32_t n_cells, const struct thaw_kvlayout_frame *f,
                          size_t n_tail, size_t headroom, unsigned flags, struct thaw_kvlayout_asm **out);
/* flags: the state goes into a blob (blob.h: release it with
 * thaw_blob_unref), whose pool hands back memory written before; fresh
 * pages cost more than the copy on some VMs */
#define THAW_KVLAYOUT_ASM_BLOB 1u
/* The next block's head (n_head bytes, exactly its head) for a block file
 * of n_block bytes: checks it (shape as block 0's: THAW_EMISMATCH; not the
 * next position: THAW_EINVAL; damaged or not n_block long: THAW_ECORRUPT),
 * writes its cells' meta and gives its first position and cell count. */
int thaw_kvlayout_asm_head(struct thaw_kvlayout_asm *a, const void *head, size_t n_head, uint64_t n_block,
                           uint32_t *pos0, uint32_t *n_cells);
/* Up to cap destinations of the data of the block at pos0 with n_cells
 * cells (as thaw_kvlayout_asm_head gave them), continuing from *cur, in
 * the block's byte order. Returns how many (0: none left). */
int thaw_kvlayout_asm_segments(const struct thaw_kvlayout_asm *a, uint32_t pos0, uint32_t n_cells,
                               struct thaw_kvlayout_cursor *cur, struct iovec *iov, int cap);
/* A whole block in memory, checked as thaw_kvlayout_asm_head checks a
 * head, put in place; *n_cells (may be NULL) gets its cell count. */
int thaw_kvlayout_asm_copy(struct thaw_kvlayout_asm *a, const void *block, size_t n, uint32_t *n_cells);
/* The bytes of one section (the layout at the top, as thaw_kvlayout_tail
 * gives it) of n_cells cells shaped as the block whose head is head0, for
 * frame f: the n_tail to give thaw_kvlayout_asm_new for an SWA section
 * built in place. 0, THAW_ECORRUPT / THAW_EVERSION, THAW_EINVAL or
 * THAW_ENOMEM. */
int thaw_kvlayout_section_size(const void *head0, size_t n_head0, uint32_t n_cells,
                               const struct thaw_kvlayout_frame *f, size_t *n);
/* Lays out a's tail (n_tail bytes, exactly thaw_kvlayout_section_size of
 * the same shape) as an SWA section of n_cells cells from position pos0,
 * shaped as the block whose head is head0 (DESIGN §12: the window a
 * restore rebuilds from SWA blocks, read straight into place like section
 * 0's). Its blocks then go in through thaw_kvlayout_asm_swa_part(a), with
 * thaw_kvlayout_asm_head, _segments and _copy as for a, in position order
 * from pos0; thaw_kvlayout_asm_finish(a, NULL, 0, ...) checks both
 * sections are whole. 0, THAW_ECORRUPT / THAW_EVERSION, THAW_EINVAL (sizes
 * that do not match, called twice) or THAW_ENOMEM. */
int thaw_kvlayout_asm_swa(struct thaw_kvlayout_asm *a, const void *head0, size_t n_head0, uint32_t pos0,
                          uint32_t n_cells);
/* The SWA section's assembler (owned by a; NULL before thaw_kvlayout_asm_swa). */
struct thaw_kvlayout_asm *thaw_kvlayout_asm_swa_part(struct thaw_kvlayout_asm *a);
/* Checks every cell was placed, appends the tail; on 0 *out is the
 * allocation (free() it, or thaw_blob_unref() with THAW_KVLAYOUT_ASM_BLOB:
 * headroom, then *n_out bytes of state). */
int thaw_kvlayout_asm_finish(struct thaw_kvlayout_asm *a, const void *tail, size_t n_tail, void **out, size_t *n_out);
void thaw_kvlayout_asm_free(struct thaw_kvlayout_asm *a);

/* Start-up check that this module understands ctx's state: decodes a few
 * tokens into seq (which must be a spare, empty sequence), captures the
 * state, parses it, cuts it into blocks of 2 cells, assembles them, compares
 * byte for byte with the capture and restores the result with
 * llama_state_seq_set_data. seq is left empty.
 * Returns 0 (blocks can be used), THAW_ELAYOUT (they cannot: whole-state
 * entries only; `why` says why in one line), THAW_ELLAMA (a decode or state
 * call failed) or THAW_ENOMEM. `why` (n_why bytes, may be NULL) gets a
 * one-line reason on failure, "" on success. */
int thaw_kvlayout_selftest(struct llama_context *ctx, thaw_seq_id seq, char *why, size_t n_why);

#endif
