/* grammar_check.h — a chain's grammar asked as late and about as few
 * candidates as the pick allows: a greedy stage that asks about the best
 * candidates first, and for sampled picks llama-server's check of the one
 * token drawn.
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
 * Neither where a stage must see what the grammar forbids (the reasoning
 * budget) or post-sampling probabilities are asked for (they are the
 * distribution over every allowed token): sampler.c decides.
 */
#ifndef THAW_GRAMMAR_CHECK_H
#define THAW_GRAMMAR_CHECK_H

#include <llama.h>

/* Wraps `grammar` (a libllama grammar sampler, owned from now on: freed
 * with the stage, also on failure). Accepting a token accepts it into the
 * grammar (which may throw, as the grammar sampler itself does: callers
 * sample through template.h's wrappers). NULL on ENOMEM. */
struct llama_sampler *thaw_grammar_greedy_new(struct llama_sampler *grammar);

/* A sampled pick (temperature, top-k, ... then dist): `rest` (the chain
 * without the grammar) draws a token from every candidate; when the grammar
 * allows it, it stands; otherwise the candidates are restored and the
 * grammar goes first, as in the grammar-first chain, and `rest` draws again.
 * This is llama-server's common_sampler with grammar_first = false. The
 * grammar is asked about one token whenever the first draw is allowed (a
 * real model's usual case inside a tool call or a JSON reply). With only
 * temperature before the draw the distribution is the grammar-first
 * chain's (a refused draw is redrawn from the allowed tokens: P(t) =
 * p(t) + (1 - Z) p(t) / Z = p(t) / Z); truncating stages (top-k, top-p,
 * min-p) see every candidate on the first draw, as llama-server's do, so
 * there it can differ slightly. Owns both samplers (freed with it, also on failure);
 * accepting a token accepts it into both. NULL on ENOMEM. */
struct llama_sampler *thaw_grammar_check_new(struct llama_sampler *grammar, struct llama_sampler *rest);

#endif
