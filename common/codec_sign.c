/* codec_sign.c - the sign codec: one bit per element and one scale per
 * slice (signSGD with error feedback, Karimireddy et al. 2019).
 *
 * Layout (little-endian): float32 scale, then ceil(n / 8) bytes of bits;
 * bit (i % 8) of byte i / 8 (least significant first) is the sign bit of
 * v[i] = x[i] + residual[i]: 1 for negative (-0 included), 0 otherwise.
 * The bits past n in the last byte are 0 (the decoder rejects anything
 * else). scale is mean |v| over the slice, finite and >= 0, so the
 * decoded values, bit ? -scale : +scale, have the same L1 norm as v.
 *
 * The encoder packs 8 values into a byte at a time from their IEEE sign
 * bits (SSE2 movemask on x86-64, shifts elsewhere). Non-finite input has no
 * mean: encode() returns PS_ENOFINITE with the residual as it was.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define SIGN_HDR 4

static size_t sign_max_bytes(size_t n, const struct ps_codec_params *p)
{
	(void)p;
	return n / 8 + (n % 8 != 0) + SIGN_HDR;
}

/* Sign bits of 8 floats, v[0] in bit 0. */
static inline uint8_t pack8(const float *v)
{
#ifdef __SSE2__
	return (uint8_t)(_mm_movemask_ps(_mm_loadu_ps(v)) | _mm_movemask_ps(_mm_loadu_ps(v + 4)) << 4);
#else
	uint32_t u[8], b = 0;

	memcpy(u, v, sizeof(u));
	for (int j = 0; j < 8; j++)
		b |= (u[j] >> 31) << j;
	return (uint8_t)b;
#endif
}

static inline uint32_t f2u(float v)
{
	uint32_t u;

	memcpy(&u, &v, sizeof(u));
	return u;
}

/* Sum of |x + residual|: 4 float lanes over blocks of 1024 values, each
 * block added into a double (a float sum of millions of values would lose
 * the small ones). Non-finite when some element is. */
static inline __attribute__((always_inline)) double
sum_abs(const float *x, const float *residual, size_t n)
{
	const ps__v4i absmask = (ps__v4i){ 0 } + 0x7fffffff;
	double sum = 0;
	size_t i = 0;

	while (i + 4 <= n) {
		size_t end = n - i > 1024 ? i + 1024 : n;
		ps__v4f acc = { 0 };

		for (; i + 4 <= end; i += 4) {
			ps__v4f v = residual ? ps__ld4(x + i) + ps__ld4(residual + i) : ps__ld4(x + i);

			acc += (ps__v4f)((ps__v4i)v & absmask);
		}
		sum += (double)acc[0] + (double)acc[1] + (double)acc[2] + (double)acc[3];
	}
	for (; i < n; i++)
		sum += fabsf(residual ? x[i] + residual[i] : x[i]);
	return sum;
}

/* Bits and residual for 8 values at a time: the decoded value is s with
 * the sign bit of v, so residual = v - copysign(s, v). */
static inline __attribute__((always_inline)) void
pack_all(const float *x, float *residual, size_t n, float s, uint8_t *bits)
{
	const ps__v4i sgn = (ps__v4i){ 0 } + (int32_t)0x80000000u;
	const ps__v4i sb = (ps__v4i){ 0 } + (int32_t)f2u(s);
	size_t nb = n / 8;

	for (size_t i = 0; i < nb; i++) {
		float v[8];

		if (!residual) {
			bits[i] = pack8(x + 8 * i);
			continue;
		}
		for (int h = 0; h < 8; h += 4) {
			ps__v4f a = ps__ld4(x + 8 * i + h) + ps__ld4(residual + 8 * i + h);

			ps__st4(v + h, a);
			ps__st4(residual + 8 * i + h, a - (ps__v4f)(((ps__v4i)a & sgn) | sb));
		}
		bits[i] = pack8(v);
	}
	if (n % 8) {   /* the tail, with the unused bits left 0 */
		uint8_t b = 0;

		for (size_t i = 8 * nb; i < n; i++) {
			float v = residual ? x[i] + residual[i] : x[i];
			int neg = (int)(f2u(v) >> 31);

			b |= (uint8_t)(neg << (i % 8));
			if (residual)
				residual[i] = v - (neg ? -s : s);
		}
		bits[nb] = b;
	}
}

static ssize_t sign_encode(const float *x, float *residual, size_t n,
			   const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap)
{
	double sum;
	float s;

	(void)nonce;
	if (cap < sign_max_bytes(n, p) || n > SSIZE_MAX / 2)
		return -ENOBUFS;
	sum = residual ? sum_abs(x, residual, n) : sum_abs(x, NULL, n);
	if (!isfinite(sum))
		return PS_ENOFINITE;
	s = n ? (float)(sum / (double)n) : 0.0f;
	ps__st_f32(out, s);
	if (residual)
		pack_all(x, residual, n, s, (uint8_t *)out + SIGN_HDR);
	else
		pack_all(x, NULL, n, s, (uint8_t *)out + SIGN_HDR);
	return (ssize_t)sign_max_bytes(n, p);
}

/* Checks the payload; on success sets *s to the scale. */
static int sign_check(const void *enc, size_t len, size_t n, float *s, char *err, size_t errlen)
{
	const uint8_t *bits = (const uint8_t *)enc + SIGN_HDR;
	int rc;

	if (len < SIGN_HDR)
		return ps__codec_fail(err, errlen, "sign: payload is %zu bytes, shorter than its "
				      "4-byte scale", len);
	rc = ps__codec_check_len("sign", len, sign_max_bytes(n, NULL), n, err, errlen);
	if (rc)
		return rc;
	*s = ps__ld_f32(enc);
	rc = ps__codec_check_scale("sign", *s, err, errlen);
	if (rc)
		return rc;
	if (n % 8 && bits[n / 8] >> (n % 8))
		return ps__codec_fail(err, errlen, "sign: padding bits past value %zu are not 0 "
				      "(last byte 0x%02x)", n, bits[n / 8]);
	return 0;
}

/* acc[i] (+)= bit ? -a : a, 8 at a time: bit i of the byte, moved to
 * the sign position, is XORed into a. */
static void sign_apply(const uint8_t *bits, size_t n, float a, float *acc, int add)
{
	const ps__v4u shl_lo = { 31, 30, 29, 28 }, shl_hi = { 27, 26, 25, 24 };
	const ps__v4u sgn = (ps__v4u){ 0 } + 0x80000000u, ua = (ps__v4u){ 0 } + f2u(a);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		ps__v4u b = (ps__v4u){ 0 } + (uint32_t)bits[i / 8];
		ps__v4f lo = (ps__v4f)(((b << shl_lo) & sgn) ^ ua);
		ps__v4f hi = (ps__v4f)(((b << shl_hi) & sgn) ^ ua);

		if (add) {
			lo += ps__ld4(acc + i);
			hi += ps__ld4(acc + i + 4);
		}
		ps__st4(acc + i, lo);
		ps__st4(acc + i + 4, hi);
	}
	for (; i < n; i++) {
		uint32_t u = f2u(a) ^ ((uint32_t)(bits[i / 8] >> (i % 8)) & 1u) << 31;
		float d;

		memcpy(&d, &u, sizeof(d));
		if (add)
			acc[i] += d;
		else
			acc[i] = d;
	}
}

static int sign_decode_add(const void *enc, size_t len, size_t n, float scale, float *acc,
			   char *err, size_t errlen)
{
	float s;
	int rc = sign_check(enc, len, n, &s, err, errlen);

	if (rc)
		return rc;
	sign_apply((const uint8_t *)enc + SIGN_HDR, n, scale * s, acc, 1);
	return 0;
}

static int sign_decode(const void *enc, size_t len, size_t n, float *out, char *err,
		       size_t errlen)
{
	float s;
	int rc = sign_check(enc, len, n, &s, err, errlen);

	if (rc)
		return rc;
	sign_apply((const uint8_t *)enc + SIGN_HDR, n, s, out, 0);
	return 0;
}

const struct ps_codec_ops ps__codec_sign = {
	.name = "sign",
	.kind = PS_CODEC_SIGN,
	.lossy_ef = 1,
	.max_bytes = sign_max_bytes,
	.encode = sign_encode,
	.decode_add = sign_decode_add,
	.decode = sign_decode,
};
