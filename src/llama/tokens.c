/* tokens.c — token-array helpers shared by the engine, the draft and the
 * scheduler. */
#include "llama/tokens.h"

#include "base/error.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

int thaw_lcp(const llama_token *a, int na, const llama_token *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;

    while (i < n && a[i] == b[i])
        i++;
    return i;
}

int thaw_tokens_reserve(llama_token **v, int *cap, int n)
{
    if (n <= *cap)
        return 0;
    if (n < 0 || (size_t)n > SIZE_MAX / sizeof(llama_token))
        return THAW_ETOOBIG;
    /* double while that cannot overflow; past INT_MAX / 2 take n itself */
    int c = *cap > 0 ? *cap : 256;
    while (c < n)
        c = c <= INT_MAX / 2 ? c * 2 : n;
    llama_token *nv = realloc(*v, (size_t)c * sizeof *nv);
    if (!nv)
        return THAW_ENOMEM;
    *v = nv;
    *cap = c;
    return 0;
}

int thaw_tokens_max_bytes(const struct llama_vocab *vocab)
{
    char piece[8];
    int best = 1;

    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); t++) {
        int n = llama_token_to_piece(vocab, t, piece, sizeof piece, 0, true);
        if (n < 0)
            n = -n; /* the size it needs */
        if (n > best)
            best = n;
    }
    return best;
}
