/* codec_fp16.c - the fp16 codec: IEEE 754 binary16, round to nearest even.
 *
 * Layout (little-endian): n uint16 halves, 2n bytes, nothing else.
 *
 * Conversion, the same bits on every path:
 *   - finite values round to nearest even; |error| <= 2^-11 |x| while the
 *     result is a normal half (|x| >= 2^-14), <= 2^-25 below that, where
 *     results are subnormal halves (down to 2^-24) or zero;
 *   - finite values beyond the half range saturate to +-65504 (a large but
 *     finite gradient stays usable; plain IEEE conversion would give inf);
 *   - +-inf stay +-inf and NaN stays NaN (quieted, sign and top payload
 *     bits kept), so the shard's finiteness check still sees them;
 *   - +-0 keep their sign.
 * Decoding is exact (every half is a float).
 *
 * Encoding uses the F16C instructions (8 values per instruction) when the
 * CPU has them, checked at run time, and portable bit manipulation
 * otherwise. With a residual buffer the rounding error is carried over to
 * the next step like any other error feedback (lossy_ef is still 0: the
 * error is small enough that workers do not keep a residual by default).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

#define HALF_MAX_BITS 0x7bffu    /* 65504 */

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* One float to half, round to nearest even, finite values saturated. */
static uint16_t half_from_float(float f)
{
	uint32_t u = f2u(f);
	uint32_t sign = (u >> 16) & 0x8000u;

	u &= 0x7fffffffu;
	if (u >= 0x7f800000u)       /* inf stays inf; NaN is quieted, payload top bits kept */
		return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u));
	if (u >= 0x477ff000u)       /* >= 65520 rounds to inf in IEEE: saturate */
		return (uint16_t)(sign | HALF_MAX_BITS);
	if (u < 0x38800000u) {      /* below 2^-14: subnormal half or zero */
		/* Adding 0.5 puts the half's subnormal bits at the bottom of
		 * the float's mantissa, rounded to nearest even by the FPU. */
		float t = u2f(u) + 0.5f;

		return (uint16_t)(sign | (f2u(t) - 0x3f000000u));
	}
	/* Normal: rebias the exponent and round the 13 dropped bits to even. */
	u += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u);
	return (uint16_t)(sign | (u >> 13));
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

	if (exp == 0x1f)   /* inf, or NaN quieted as F16C does */
		return u2f(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
	if (exp == 0)   /* zero or subnormal: man * 2^-24, exact in float */
		return u2f(sign | f2u((float)man * 0x1p-24f));
	return u2f(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

static void pack_portable(const float *x, float *residual, size_t n, uint16_t *out)
{
	for (size_t i = 0; i < n; i++) {
		float v = residual ? x[i] + residual[i] : x[i];
		uint16_t h = half_from_float(v);

		if (residual)
			residual[i] = v - half_to_float(h);
		memcpy(out + i, &h, sizeof(h));
	}
}

static void unpack_portable(const uint16_t *in, size_t n, float scale, float *acc, int add)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t h;

		memcpy(&h, in + i, sizeof(h));
		if (add)
			acc[i] += scale * half_to_float(h);
		else
			acc[i] = half_to_float(h);
	}
}

#ifdef HAVE_X86
/* Finite values clamped to +-65504, inf and NaN passed through. */
__attribute__((target("avx,f16c")))
static inline __m128i cvt8(__m256 v)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 hmax = _mm256_set1_ps(65504.0f), inf = _mm256_set1_ps(__builtin_inff());
	__m256 a = _mm256_and_ps(v, absmask);
	__m256 c = _mm256_or_ps(_mm256_min_ps(a, hmax), _mm256_andnot_ps(absmask, v));
	__m256 finite = _mm256_cmp_ps(a, inf, _CMP_LT_OQ);

	return _mm256_cvtps_ph(_mm256_blendv_ps(v, c, finite), _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx,f16c")))
static void pack_f16c(const float *x, float *residual, size_t n, uint16_t *out)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);

		if (residual) {
			__m256 r = _mm256_loadu_ps(residual + i);
			__m128i h;

			v = _mm256_add_ps(v, r);
			h = cvt8(v);
			_mm256_storeu_ps(residual + i, _mm256_sub_ps(v, _mm256_cvtph_ps(h)));
			_mm_storeu_si128((__m128i *)(out + i), h);
		} else {
			_mm_storeu_si128((__m128i *)(out + i), cvt8(v));
		}
	}
	if (i < n)
		pack_portable(x + i, residual ? residual + i : NULL, n - i, out + i);
}

__attribute__((target("avx,f16c")))
static void unpack_f16c(const uint16_t *in, size_t n, float scale, float *acc, int add)
{
	__m256 s = _mm256_set1_ps(scale);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i)));

		if (add)
			v = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(s, v));
		_mm256_storeu_ps(acc + i, v);
	}
	if (i < n)
		unpack_portable(in + i, n - i, scale, acc + i, add);
}
#endif

int ps__fp16_have_simd(void)
{
#ifdef HAVE_X86
	/* cpuid rather than __builtin_cpu_supports("f16c"), which clang (the
	 * fuzzing build) does not know: AVX and F16C in the CPU, and the OS
	 * saving the YMM registers (XGETBV bits 1 and 2). */
	unsigned a, b, c, d, lo, hi;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX) ||
	    !(c & bit_F16C))
		return 0;
	__asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	(void)hi;
	return (lo & 6) == 6;
#else
	return 0;
#endif
}

void ps__fp16_pack(const float *x, float *residual, size_t n, uint16_t *out, int simd)
{
#ifdef HAVE_X86
	if (simd && ps__fp16_have_simd()) {
		pack_f16c(x, residual, n, out);
		return;
	}
#endif
	(void)simd;
	pack_portable(x, residual, n, out);
}

void ps__fp16_unpack(const uint16_t *in, size_t n, float scale, float *acc, int add, int simd)
{
#ifdef HAVE_X86
	if (simd && ps__fp16_have_simd()) {
		unpack_f16c(in, n, scale, acc, add);
		return;
	}
#endif
	(void)simd;
	unpack_portable(in, n, scale, acc, add);
}

static size_t fp16_max_bytes(size_t n, const struct ps_codec_params *p)
{
	(void)p;
	return ps__codec_mul(n, sizeof(uint16_t));
}

static ssize_t fp16_encode(const float *x, float *residual, size_t n,
			   const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap)
{
	(void)nonce;
	if (cap < fp16_max_bytes(n, p) || n > SSIZE_MAX / sizeof(uint16_t))
		return -ENOBUFS;
	ps__fp16_pack(x, residual, n, out, 1);
	return (ssize_t)(n * sizeof(uint16_t));
}

static int fp16_decode_add(const void *enc, size_t len, size_t n, float scale, float *acc,
			   char *err, size_t errlen)
{
	int rc = ps__codec_check_len("fp16", len, ps__codec_mul(n, sizeof(uint16_t)), n, err,
				     errlen);

	if (rc)
		return rc;
	ps__fp16_unpack(enc, n, scale, acc, 1, 1);
	return 0;
}

static int fp16_decode(const void *enc, size_t len, size_t n, float *out, char *err,
		       size_t errlen)
{
	int rc = ps__codec_check_len("fp16", len, ps__codec_mul(n, sizeof(uint16_t)), n, err,
				     errlen);

	if (rc)
		return rc;
	ps__fp16_unpack(enc, n, 1.0f, out, 0, 1);
	return 0;
}

const struct ps_codec_ops ps__codec_fp16 = {
	.name = "fp16",
	.kind = PS_CODEC_FP16,
	.lossy_ef = 0,
	.max_bytes = fp16_max_bytes,
	.encode = fp16_encode,
	.decode_add = fp16_decode_add,
	.decode = fp16_decode,
};
