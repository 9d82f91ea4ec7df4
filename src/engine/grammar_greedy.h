/* grammar_greedy.h — a grammar stage for greedy picks that asks the grammar
 * about the best candidates first.
 *
 * libllama's grammar sampler decides every candidate it is given: on a
 * 128k vocabulary that is ~128k UTF-8 decodes and stack walks (10-15 ms
 * a token on a 2-core VM, more than a small model's forward), paid for
 * every generated token of a request with a grammar (response_format, a
 * tool call, a GBNF), and for every drafted token a verify samples.
 * A greedy pick needs less: the highest candidate the grammar allows. So
 * this stage, placed after the stages that only add to logits (biases) and
 * right before the greedy pick, asks the grammar about the single best
 * candidate, then the best 64, then the best 1024, and only then about
 * all of them; the first group holding an allowed token holds the pick
 * (every candidate outside it is lower), and the stage leaves that one
 * token. The token chosen is exactly the one the grammar-first chain picks
 * (ties go to the lower id, as a scan in id order). llama-server checks
 * the one sampled token before the whole vocabulary too (common_sampler's
 * grammar_first = false); the groups in between are thaw's.
 *
 * Only for greedy chains without a stage that reads what the grammar
 * forbids (the reasoning budget) and without post-sampling probabilities
 * (they are the distribution over every allowed token): sampler.c decides.
 */
#ifndef THAW_GRAMMAR_GREEDY_H
#define THAW_GRAMMAR_GREEDY_H

#include <llama.h>

/* Wraps `grammar` (a libllama grammar sampler, owned from now on: freed
 * with the stage, also on failure). Accepting a token accepts it into the
 * grammar (which may throw, as the grammar sampler itself does: callers
 * sample through template.h's wrappers). NULL on ENOMEM. */
struct llama_sampler *thaw_grammar_greedy_new(struct llama_sampler *grammar);

#endif
