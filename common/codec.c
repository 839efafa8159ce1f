/* codec.c - the codec registry, the helpers every decoder reports errors
 * through, and the `none` codec (interface in codec.h; docs/architecture.md, Interfaces).
 *
 * `none` layout (little-endian): n float32 values, 4n bytes, nothing else.
 * It is lossless, so with a residual buffer encode() sends x + residual and
 * leaves the residual at zero. Values are passed through as they are, NaN
 * and infinities included: rejecting non-finite gradients is the shard's
 * job (PS_ENOFINITE), not the codec's.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

/* Indexed by enum ps_codec_kind. */
static const struct ps_codec_ops *const codecs[PS_CODEC_COUNT] = {
	[PS_CODEC_NONE] = &ps__codec_none,
	[PS_CODEC_FP16] = &ps__codec_fp16,
	[PS_CODEC_Q8] = &ps__codec_q8,
	[PS_CODEC_TOPK] = &ps__codec_topk,
	[PS_CODEC_SIGN] = &ps__codec_sign,
};

const struct ps_codec_ops *ps_codec_find(const char *name)
{
	if (!name)
		return NULL;
	for (int i = 0; i < PS_CODEC_COUNT; i++)
		if (strcmp(codecs[i]->name, name) == 0)
			return codecs[i];
	return NULL;
}

const struct ps_codec_ops *ps_codec_get(enum ps_codec_kind kind)
{
	if ((unsigned)kind >= PS_CODEC_COUNT)
		return NULL;
	return codecs[kind];
}

int ps__codec_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return PS_EPROTO;
}

int ps__codec_check_len(const char *codec, size_t len, size_t want, size_t n, char *err,
			size_t errlen)
{
	if (len == want)
		return 0;
	if (want == SIZE_MAX)
		return ps__codec_fail(err, errlen, "%s: %zu values cannot be encoded in %zu bytes",
				      codec, n, len);
	return ps__codec_fail(err, errlen, "%s: payload is %zu bytes, expected %zu for %zu values",
			      codec, len, want, n);
}

int ps__codec_check_scale(const char *codec, float s, char *err, size_t errlen)
{
	/* The comparison is false for NaN as well as for the infinities. */
	if (!(s >= 0.0f && s <= 3.40282347e+38f))
		return ps__codec_fail(err, errlen, "%s: scale %g is not a finite value >= 0", codec,
				      (double)s);
	return 0;
}

/* ---- none ---- */

static size_t none_max_bytes(size_t n, const struct ps_codec_params *p)
{
	(void)p;
	return ps__codec_mul(n, sizeof(float));
}

static ssize_t none_encode(const float *x, float *residual, size_t n,
			   const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap)
{
	float *o = out;

	(void)p;
	(void)nonce;
	if (cap < none_max_bytes(n, p) || n > SSIZE_MAX / sizeof(float))
		return -ENOBUFS;
	if (!residual) {
		memcpy(out, x, n * sizeof(float));
		return (ssize_t)(n * sizeof(float));
	}
	/* Everything is sent, so nothing is left over. */
	for (size_t i = 0; i < n; i++) {
		o[i] = x[i] + residual[i];
		residual[i] = 0.0f;
	}
	return (ssize_t)(n * sizeof(float));
}

static int none_decode_add(const void *enc, size_t len, size_t n, float scale, float *acc,
			   char *err, size_t errlen)
{
	const char *v = enc;
	size_t i = 0;
	int rc = ps__codec_check_len("none", len, ps__codec_mul(n, sizeof(float)), n, err, errlen);

	if (rc)
		return rc;
	for (; i + 4 <= n; i += 4)
		ps__st4(acc + i, ps__ld4(acc + i) + scale * ps__ld4(v + 4 * i));
	for (; i < n; i++)
		acc[i] += scale * ps__ld_f32(v + 4 * i);
	return 0;
}

static int none_decode(const void *enc, size_t len, size_t n, float *out, char *err,
		       size_t errlen)
{
	int rc = ps__codec_check_len("none", len, ps__codec_mul(n, sizeof(float)), n, err, errlen);

	if (rc)
		return rc;
	memcpy(out, enc, len);
	return 0;
}

const struct ps_codec_ops ps__codec_none = {
	.name = "none",
	.kind = PS_CODEC_NONE,
	.lossy_ef = 0,
	.max_bytes = none_max_bytes,
	.encode = none_encode,
	.decode_add = none_decode_add,
	.decode = none_decode,
};
