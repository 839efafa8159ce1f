/* finite.h - whether float32 values are all finite, at memory speed.
 *
 * Every pushed gradient is checked before a shard accepts it; the TCP
 * transport runs the same check over each payload while the bytes are
 * still in cache (struct ps_frame.payload_finite), which spares the shard
 * a second pass over raw float slices.
 */
#ifndef PS_FINITE_H
#define PS_FINITE_H

#include <stddef.h>

/* 1 when none of the n 4-byte words at p (any alignment) is a float32 NaN
 * or infinity (exponent bits all ones), else 0. */
int ps_words_finite(const void *p, size_t n);

#endif
