/* codec_q8.c - the q8 codec: 8-bit stochastic rounding with one scale per
 * slice (QSGD-style, unbiased).
 *
 * Layout (little-endian): float32 scale, then n int8 values q[i], 4 + n
 * bytes. scale is max |v| over the slice (v = x + residual), finite and
 * >= 0; q[i] is in [-127, 127] (-128 is never sent and is rejected).
 * The decoded value is q[i] * step with step = scale / 127.0f, computed
 * by encoder and decoder the same way so the residual is exact.
 *
 * Rounding: with t = v / step, q = floor(t) + (u < t - floor(t)) for u
 * uniform in [0, 1), so E[q * step] = v and |q * step - v| < step = scale /
 * 127. u is a multiple of 2^-24 from a counter-based hash of (seed, nonce,
 * index), see hash32() below: the same
 * call gives the same bytes, on any thread, in any order of slices, and a
 * different nonce (step, slice) gives independent choices.
 *
 * Non-finite input has no scale: encode() returns PS_ENOFINITE and leaves
 * the residual as it was. A slice whose step underflows to 0 sends zeros
 * and keeps everything in the residual.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

#define Q8_HDR 4

typedef int8_t v4c __attribute__((vector_size(4)));
typedef int8_t v16c __attribute__((vector_size(16)));

/* Per element: lowbias32 (Wellons' 32-bit integer hash, a bijection) of
 * i * golden + k1, xor k2; the top 24 bits make u. 32-bit so that 4 lanes
 * run at once; slices never reach 2^32 elements. Scalar and vector forms
 * are the same operations, so they give the same u. */
#define GOLDEN32 0x9e3779b9u

static inline uint32_t hash32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static inline ps__v4u hash32v(ps__v4u x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static size_t q8_max_bytes(size_t n, const struct ps_codec_params *p)
{
	(void)p;
	return n > SIZE_MAX - Q8_HDR ? SIZE_MAX : n + Q8_HDR;
}

/* Lanes where mask is -1 take a, others b. */
static inline ps__v4f vsel(ps__v4i mask, ps__v4f a, ps__v4f b)
{
	return (ps__v4f)((mask & (ps__v4i)a) | (~mask & (ps__v4i)b));
}

/* max |x + residual|, or NaN when some element is NaN. */
static inline __attribute__((always_inline)) float
max_abs(const float *x, const float *residual, size_t n)
{
	const ps__v4i absmask = (ps__v4i){ 0 } + 0x7fffffff;
	ps__v4f m = { 0 };
	ps__v4i bad = { 0 };
	float mx = 0.0f;
	int nan = 0;
	size_t i = 0;

	for (; i + 4 <= n; i += 4) {
		ps__v4f v = residual ? ps__ld4(x + i) + ps__ld4(residual + i) : ps__ld4(x + i);
		ps__v4f a = (ps__v4f)((ps__v4i)v & absmask);

		bad |= a != a;
		m = vsel(a > m, a, m);
	}
	for (int j = 0; j < 4; j++) {
		mx = m[j] > mx ? m[j] : mx;
		nan |= bad[j];
	}
	for (; i < n; i++) {
		float a = fabsf(residual ? x[i] + residual[i] : x[i]);

		nan |= a != a;
		mx = a > mx ? a : mx;
	}
	return nan ? NAN : mx;
}

/* The rounding of one element, as the vector loop does it for 4. */
static inline int8_t quant1(float v, float inv, uint32_t u32)
{
	float t = v * inv, lo, u = (float)(int32_t)(u32 >> 8) * 0x1p-24f;
	int32_t ti;

	t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
	ti = (int32_t)t;                /* truncation, then floor */
	lo = (float)ti;
	ti -= lo > t;
	lo = (float)ti;
	return (int8_t)(ti + (u < t - lo));
}

static inline __attribute__((always_inline)) void
quantize(const float *x, float *residual, size_t n, float step, float inv, uint32_t k1,
	 uint32_t k2, int8_t *q)
{
	const ps__v4u lane = { 0, 1, 2, 3 };
	const ps__v4f lim = (ps__v4f){ 0 } + 127.0f;
	size_t i = 0;

	for (; i + 4 <= n; i += 4) {
		ps__v4f v = residual ? ps__ld4(x + i) + ps__ld4(residual + i) : ps__ld4(x + i);
		ps__v4f t = v * inv, lo, u;
		ps__v4i ti;
		ps__v4u h = hash32v((lane + (uint32_t)i) * GOLDEN32 + k1) ^ k2;
		int8_t qb[4];

		t = vsel(t > lim, lim, vsel(t < -lim, -lim, t));
		ti = __builtin_convertvector(t, ps__v4i);
		lo = __builtin_convertvector(ti, ps__v4f);
		ti += lo > t;                   /* comparisons give -1 where true */
		lo = __builtin_convertvector(ti, ps__v4f);
		u = __builtin_convertvector((ps__v4i)(h >> 8), ps__v4f) * 0x1p-24f;
		ti -= u < t - lo;
		for (int j = 0; j < 4; j++)
			qb[j] = (int8_t)ti[j];
		memcpy(q + i, qb, 4);
		if (residual)
			ps__st4(residual + i, v - __builtin_convertvector(ti, ps__v4f) * step);
	}
	for (; i < n; i++) {
		float v = residual ? x[i] + residual[i] : x[i];

		q[i] = quant1(v, inv, hash32((uint32_t)i * GOLDEN32 + k1) ^ k2);
		if (residual)
			residual[i] = v - (float)q[i] * step;
	}
}

static ssize_t q8_encode(const float *x, float *residual, size_t n,
			 const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap)
{
	int8_t *q = (int8_t *)((char *)out + Q8_HDR);
	uint64_t key = ps__fmix64((p ? p->seed : 0) ^ ps__fmix64(nonce ^ 0x9e3779b97f4a7c15ull));
	float s, step, inv;

	if (cap < q8_max_bytes(n, p) || n > SSIZE_MAX - Q8_HDR)
		return -ENOBUFS;
	if (n > UINT32_MAX)
		return PS_ETOOBIG;
	s = residual ? max_abs(x, residual, n) : max_abs(x, NULL, n);
	if (!isfinite(s))
		return PS_ENOFINITE;
	step = s / 127.0f;
	ps__st_f32(out, s);
	if (step == 0.0f) {
		/* Nothing representable: send zeros, keep it all in the residual. */
		memset(q, 0, n);
		if (residual)
			for (size_t i = 0; i < n; i++)
				residual[i] += x[i];
		return (ssize_t)(n + Q8_HDR);
	}
	inv = 1.0f / step;
	if (!isfinite(inv))
		inv = 3.40282347e+38f;  /* step below 2^-128: t is clamped */
	if (residual)
		quantize(x, residual, n, step, inv, (uint32_t)key, (uint32_t)(key >> 32), q);
	else
		quantize(x, NULL, n, step, inv, (uint32_t)key, (uint32_t)(key >> 32), q);
	return (ssize_t)(n + Q8_HDR);
}

/* Checks the payload; on success sets *step. */
static int q8_check(const void *enc, size_t len, size_t n, float *step, char *err,
		    size_t errlen)
{
	const int8_t *q = (const int8_t *)((const char *)enc + Q8_HDR);
	size_t want = q8_max_bytes(n, NULL);
	int bad = 0, rc;
	float s;

	if (len < Q8_HDR)
		return ps__codec_fail(err, errlen, "q8: payload is %zu bytes, shorter than its "
				      "4-byte scale", len);
	rc = ps__codec_check_len("q8", len, want, n, err, errlen);
	if (rc)
		return rc;
	s = ps__ld_f32(enc);
	rc = ps__codec_check_scale("q8", s, err, errlen);
	if (rc)
		return rc;
	size_t i = 0;
	v16c any = { 0 };

	for (; i + 16 <= n; i += 16) {
		v16c b;

		memcpy(&b, q + i, sizeof(b));
		any |= b == -128;
	}
	for (int j = 0; j < 16; j++)
		bad |= any[j];
	for (; i < n; i++)
		bad |= q[i] == -128;
	if (bad)
		return ps__codec_fail(err, errlen, "q8: value -128 is outside [-127, 127]");
	*step = s / 127.0f;
	return 0;
}

static int q8_decode_add(const void *enc, size_t len, size_t n, float scale, float *acc,
			 char *err, size_t errlen)
{
	const int8_t *q = (const int8_t *)((const char *)enc + Q8_HDR);
	size_t i = 0;
	float step;
	int rc = q8_check(enc, len, n, &step, err, errlen);

	if (rc)
		return rc;

	for (; i + 4 <= n; i += 4) {
		v4c qc;
		ps__v4i qi;

		memcpy(&qc, q + i, sizeof(qc));
		qi = __builtin_convertvector(qc, ps__v4i);
		ps__st4(acc + i, ps__ld4(acc + i) + scale * (__builtin_convertvector(qi, ps__v4f) * step));
	}
	for (; i < n; i++)
		acc[i] += scale * ((float)q[i] * step);
	return 0;
}

static int q8_decode(const void *enc, size_t len, size_t n, float *out, char *err,
		     size_t errlen)
{
	const int8_t *q = (const int8_t *)((const char *)enc + Q8_HDR);
	float step;
	int rc = q8_check(enc, len, n, &step, err, errlen);

	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		out[i] = (float)q[i] * step;
	return 0;
}

const struct ps_codec_ops ps__codec_q8 = {
	.name = "q8",
	.kind = PS_CODEC_Q8,
	.lossy_ef = 1,
	.max_bytes = q8_max_bytes,
	.encode = q8_encode,
	.decode_add = q8_decode_add,
	.decode = q8_decode,
};
