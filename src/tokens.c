/* tokens.c — token-array helpers shared by the engine, the draft and the
 * scheduler. */
#include "tokens.h"

#include "error.h"

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
    int c = *cap ? *cap : 256;
    while (c < n)
        c *= 2;
    llama_token *nv = realloc(*v, (size_t)c * sizeof *nv);
    if (!nv)
        return THAW_ENOMEM;
    *v = nv;
    *cap = c;
    return 0;
}
