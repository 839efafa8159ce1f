/* codec_int.h - what the codec files share and nothing else includes
 * (tests excepted): the ops tables of each codec for the registry, the
 * little-endian load/store helpers of the encoded layouts, the error
 * helpers every decoder reports through, and the fp16 kernels with their
 * portable/F16C choice exposed so a test can compare the two.
 */
#ifndef PS_CODEC_INT_H
#define PS_CODEC_INT_H

#include <stdint.h>
#include <string.h>
#include "codec.h"

/* The encoded layouts are little-endian and are read and written with
 * memcpy; a big-endian port needs byte swaps in the helpers below and in
 * the bulk copies of none/fp16/topk. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codec layouts assume a little-endian host"
#endif

/* GCC vector extensions for the hot loops: 4 lanes, lowered to whatever the
 * target has (SSE2 on baseline x86-64). -O2 does not
 * vectorize loops whose length is unknown, so they are written this way.
 * 4 lanes: SSE2 width, and wider vectors passed by value change the ABI.
 * Loads and stores go through memcpy: payloads may be unaligned. */
typedef float ps__v4f __attribute__((vector_size(16)));
typedef int32_t ps__v4i __attribute__((vector_size(16)));
typedef uint32_t ps__v4u __attribute__((vector_size(16)));

static inline ps__v4f ps__ld4(const void *p)
{
	ps__v4f v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void ps__st4(void *p, ps__v4f v)
{
	memcpy(p, &v, sizeof(v));
}

extern const struct ps_codec_ops ps__codec_none;
extern const struct ps_codec_ops ps__codec_fp16;
extern const struct ps_codec_ops ps__codec_q8;
extern const struct ps_codec_ops ps__codec_topk;
extern const struct ps_codec_ops ps__codec_sign;

static inline uint32_t ps__ld_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void ps__st_u32(void *p, uint32_t v)
{
	memcpy(p, &v, sizeof(v));
}

static inline float ps__ld_f32(const void *p)
{
	float v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void ps__st_f32(void *p, float v)
{
	memcpy(p, &v, sizeof(v));
}

/* The finalizer of MurmurHash3: a bijection of 64-bit words that mixes
 * every input bit into every output bit (q8 keys its rounding from it, topk
 * its sample positions). */
static inline uint64_t ps__fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

/* Formats the reason into err (when errlen > 0) and returns PS_EPROTO. */
int ps__codec_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* PS_EPROTO unless len == want: "<codec>: payload is L bytes, expected W for n values". */
int ps__codec_check_len(const char *codec, size_t len, size_t want, size_t n, char *err,
			size_t errlen);

/* PS_EPROTO unless the per-slice scale s is finite and >= 0. */
int ps__codec_check_scale(const char *codec, float s, char *err, size_t errlen);

/* n * size without overflow: SIZE_MAX when it would overflow (no payload
 * can be that long, so a length check against it fails cleanly). */
static inline size_t ps__codec_mul(size_t n, size_t size)
{
	size_t r;

	return __builtin_mul_overflow(n, size, &r) ? SIZE_MAX : r;
}

/* fp16 kernels (codec_fp16.c). simd = 1 uses F16C when the CPU has it,
 * 0 forces the portable code; both give the same bits. */
void ps__fp16_pack(const float *x, float *residual, size_t n, uint16_t *out, int simd);
void ps__fp16_unpack(const uint16_t *in, size_t n, float scale, float *acc, int add, int simd);
int ps__fp16_have_simd(void);

#endif
