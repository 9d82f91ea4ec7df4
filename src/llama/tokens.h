/* tokens.h — token arrays: their common prefix, and growing them; the
 * longest piece of a vocabulary. */
#ifndef THAW_TOKENS_H
#define THAW_TOKENS_H

#include <llama.h>

/* Longest common prefix of a[0..na) and b[0..nb). */
int thaw_lcp(const llama_token *a, int na, const llama_token *b, int nb);

/* Grows *v (capacity *cap) to hold at least n tokens, doubling from 256
 * (never past what an int can count). Returns 0, THAW_ETOOBIG (n negative
 * or beyond size_t) or THAW_ENOMEM; on failure *v and *cap are unchanged. */
int thaw_tokens_reserve(llama_token **v, int *cap, int n);

/* The longest text any token of vocab stands for, special ones included
 * (a prompt may spell them out), in bytes; at least 1. Walks the whole
 * vocabulary: once, at start-up. */
int thaw_tokens_max_bytes(const struct llama_vocab *vocab);

#endif
