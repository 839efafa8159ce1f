/* codec.h - gradient codecs and the LZ4 stage (docs/architecture.md, Interfaces).
 *
 * A codec turns n float32 values (one slice of a tensor) into a compact
 * byte string and back. Workers encode what they push; shards decode into
 * the aggregation path: decode_add() adds the decoded values into an
 * accumulator, so a sync shard sums every worker's encoded slice in rank
 * order without first expanding each one into a full-size buffer.
 *
 * Codecs (the encoded layout of each is documented in its .c file):
 *   none  raw float32 (n * 4 bytes); lossless
 *   fp16  IEEE half precision, round to nearest even; |error| <= 2^-11 |x|
 *         for normal halves, values beyond 65504 saturate
 *   q8    8-bit stochastic rounding with one float scale per slice
 *         (QSGD-style, unbiased): |error| <= scale / 127 per element
 *   topk  the ceil(ratio * n) largest-magnitude values with their indices
 *   sign  one bit per element plus one float scale per slice (mean |x|)
 * topk, sign and q8 are lossy in a way error feedback repairs: with a
 * residual buffer, encode() compresses x + residual and leaves in residual
 * exactly what was not sent, so over many steps sent + residual equals the
 * sum of the raw gradients.
 *
 * Decoders treat their input as hostile: a length that does not match n, a
 * count out of range, an index out of range or not increasing, a scale that
 * is not finite, give PS_EPROTO with the reason in err, and nothing is
 * written to the accumulator (decoders validate before they write).
 */
#ifndef PS_CODEC_H
#define PS_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum ps_codec_kind { PS_CODEC_NONE, PS_CODEC_FP16, PS_CODEC_Q8, PS_CODEC_TOPK, PS_CODEC_SIGN,
		     PS_CODEC_COUNT };

struct ps_codec_params {
	float ratio;          /* topk: fraction of elements kept, (0, 1] */
	uint64_t seed;        /* q8: seed of the stochastic rounding (with step and slice) */
};

struct ps_codec_ops {
	const char *name;
	enum ps_codec_kind kind;
	int lossy_ef;         /* 1 when error feedback applies (topk, sign, q8) */
	/* Largest encoded size for n values; never fails. */
	size_t (*max_bytes)(size_t n, const struct ps_codec_params *p);
	/* Encodes n values of x into out (cap >= max_bytes). With residual
	 * (n floats, or NULL for no error feedback) the values encoded are
	 * x + residual, and residual becomes what was not sent. x is not
	 * changed. nonce varies the random choices of q8 between calls (pass
	 * step and slice). Returns the encoded length, or a negative code. */
	ssize_t (*encode)(const float *x, float *residual, size_t n,
			  const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap);
	/* Checks enc (len bytes) as the encoding of n values and adds
	 * scale * decoded into acc. Returns 0, or PS_EPROTO with err filled and
	 * acc untouched. */
	int (*decode_add)(const void *enc, size_t len, size_t n, float scale, float *acc,
			  char *err, size_t errlen);
	/* Same, but writes decoded values into out (n floats) instead of adding. */
	int (*decode)(const void *enc, size_t len, size_t n, float *out, char *err, size_t errlen);
};

/* By name ("none", "fp16", "q8", "topk", "sign") or kind; NULL if unknown. */
const struct ps_codec_ops *ps_codec_find(const char *name);
const struct ps_codec_ops *ps_codec_get(enum ps_codec_kind kind);

/* The LZ4 stage, after the codec: ps_lz4_pack compresses src into dst
 * (cap >= ps_lz4_bound(len)) and returns the packed length, or 0 when it
 * would not shrink the data (then send src as it is, without the flag).
 * ps_lz4_unpack expands exactly `expect` bytes or fails with PS_EPROTO:
 * a packed block that is malformed or expands to any other length. */
size_t ps_lz4_bound(size_t len);
size_t ps_lz4_pack(const void *src, size_t len, void *dst, size_t cap);
int ps_lz4_unpack(const void *src, size_t len, void *dst, size_t expect, char *err,
		  size_t errlen);

#endif
