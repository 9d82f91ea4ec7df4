/* embed.h — embeddings and rank scores (--embedding, --rerank): the math
 * on the vectors libllama returns. The engine's side of these tasks (a
 * slot takes the task, the whole prompt goes into one micro-batch, the
 * vector comes back and the sequence is emptied) is embed.c's, declared
 * in engine_state.h with the engine's other internals.
 */
#ifndef THAW_EMBED_H
#define THAW_EMBED_H

/* llama-server's --embd-normalize on one vector of n floats, in -> out
 * (they may be the same array):
 *   -1  none (copied)
 *    0  max absolute value scaled to 32760 (an int16 range)
 *    1  taxicab (sum of |x| = 1)
 *    2  euclidean (sum of x^2 = 1)
 *   >2  p-norm
 * A zero vector stays zero. `norm` below -1 is taken as -1. */
void thaw_embd_normalize(const float *in, float *out, int n, int norm);

#endif
