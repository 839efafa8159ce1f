/* check_codec.c - the gradient codecs and the LZ4 stage (common/codec.h):
 * round trips within each codec's stated bound, the error-feedback
 * invariant over many steps, decode_add against decode, and hostile
 * payloads for every decoder.
 *
 * Hostile payloads are copied into buffers of exactly their length, so an
 * over-read shows under `make SANITIZE=address,undefined`. Every rejected
 * payload must give PS_EPROTO, a reason naming what is wrong, and leave the
 * accumulator bit for bit as it was.
 */
#include <check.h>
#include <errno.h>
#include <lz4.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"
#include "test_util.h"

/* Check's ck_assert* writes to a pipe even when the assertion passes, a
 * system call per element in the loops below: these only call it on failure. */
#define req(expr) do { if (!(expr)) ck_assert_msg(expr, "%s", #expr); } while (0)
#define req_msg(expr, ...) do { if (!(expr)) ck_assert_msg(expr, __VA_ARGS__); } while (0)

static const size_t sizes[] = { 0, 1, 7, 8, 9, 1000003 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

static double urand(void)  /* [0, 1) */
{
	return (double)(next_u64() >> 11) * 0x1p-53;
}

static float nrand(void)  /* standard normal (Box-Muller) */
{
	double u = urand(), v = urand();

	return (float)(sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v));
}

static float *fvec(size_t n)
{
	float *p = malloc((n ? n : 1) * sizeof(float));

	ck_assert_ptr_nonnull(p);
	return p;
}

static float *gradient(size_t n, float sd)
{
	float *x = fvec(n);

	for (size_t i = 0; i < n; i++)
		x[i] = sd * nrand();
	return x;
}

static void *dup_exact(const void *src, size_t len)
{
	void *p = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(p);
	if (len)
		memcpy(p, src, len);
	return p;
}

static uint32_t fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bitsf(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Encodes x (with residual r, may be NULL); returns the payload, sets *len. */
static uint8_t *enc(const struct ps_codec_ops *c, const float *x, float *r, size_t n,
		    const struct ps_codec_params *p, uint64_t nonce, size_t *len)
{
	size_t cap = c->max_bytes(n, p);
	uint8_t *out = malloc(cap ? cap : 1);
	ssize_t got;

	ck_assert_ptr_nonnull(out);
	got = c->encode(x, r, n, p, nonce, out, cap);
	req_msg(got >= 0, "%s encode of %zu: %d", c->name, n, (int)got);
	ck_assert_uint_le((size_t)got, cap);
	*len = (size_t)got;
	return out;
}

/* Decodes with decode() and checks decode_add() against it. */
static float *dec(const struct ps_codec_ops *c, const void *e, size_t len, size_t n)
{
	float *out = fvec(n), *acc = gradient(n, 1.0f), *acc0 = fvec(n);
	char err[256] = "";
	int rc;

	memcpy(acc0, acc, n * sizeof(float));
	rc = c->decode(e, len, n, out, err, sizeof(err));
	req_msg(rc == 0, "%s decode of %zu: %s", c->name, n, err);
	rc = c->decode_add(e, len, n, 0.5f, acc, err, sizeof(err));
	req_msg(rc == 0, "%s decode_add of %zu: %s", c->name, n, err);
	for (size_t i = 0; i < n; i++) {
		float want = acc0[i] + 0.5f * out[i];

		req_msg(fbits(acc[i]) == fbits(want), "%s decode_add [%zu]: %g, want %g",
			      c->name, i, acc[i], want);
	}
	free(acc);
	free(acc0);
	return out;
}

START_TEST(test_registry)
{
	static const char *names[] = { "none", "fp16", "q8", "topk", "sign" };

	for (int k = 0; k < PS_CODEC_COUNT; k++) {
		const struct ps_codec_ops *c = ps_codec_get((enum ps_codec_kind)k);

		ck_assert_ptr_nonnull(c);
		ck_assert_int_eq(c->kind, k);
		ck_assert_str_eq(c->name, names[k]);
		ck_assert_ptr_eq(ps_codec_find(names[k]), c);
		ck_assert_int_eq(c->lossy_ef, k == PS_CODEC_Q8 || k == PS_CODEC_TOPK ||
					      k == PS_CODEC_SIGN);
		ck_assert_ptr_nonnull(c->max_bytes);
		ck_assert_ptr_nonnull(c->encode);
		ck_assert_ptr_nonnull(c->decode_add);
		ck_assert_ptr_nonnull(c->decode);
	}
	ck_assert_ptr_null(ps_codec_find("zstd"));
	ck_assert_ptr_null(ps_codec_find(""));
	ck_assert_ptr_null(ps_codec_find(NULL));
	ck_assert_ptr_null(ps_codec_get(PS_CODEC_COUNT));
	ck_assert_ptr_null(ps_codec_get((enum ps_codec_kind)-1));
}
END_TEST

START_TEST(test_none_exact)
{
	const struct ps_codec_ops *c = ps_codec_find("none");

	for (size_t s = 0; s < NSIZES; s++) {
		size_t n = sizes[s], len;
		float *x = gradient(n, 3.0f), *r = gradient(n, 1.0f), *d;
		uint8_t *e;

		if (n > 3)
			x[3] = NAN;   /* passed through: the shard checks finiteness */
		e = enc(c, x, NULL, n, NULL, 0, &len);
		ck_assert_uint_eq(len, 4 * n);
		d = dec(c, e, len, n);
		req(n == 0 || memcmp(d, x, n * sizeof(float)) == 0);
		free(e);
		free(d);
		/* With a residual: x + r is sent, the residual becomes 0. */
		float *v = fvec(n);
		for (size_t i = 0; i < n; i++)
			v[i] = x[i] + r[i];
		e = enc(c, x, r, n, NULL, 0, &len);
		d = dec(c, e, len, n);
		req(n == 0 || memcmp(d, v, n * sizeof(float)) == 0);
		for (size_t i = 0; i < n; i++)
			req(fbits(r[i]) == 0);
		free(v);
		free(e);
		free(d);
		free(x);
		free(r);
	}
}
END_TEST

START_TEST(test_lz4_exact)
{
	size_t lens[] = { 1, 7, 100, 4096, 1 << 20 };

	for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
		size_t len = lens[t], cap = ps_lz4_bound(len), packed;
		uint8_t *src = malloc(len), *dst = malloc(cap), *back = malloc(len);
		char err[128] = "";

		req(src && dst && back);
		/* Compressible: runs and small integers, like sparse gradients. */
		for (size_t i = 0; i < len; i++)
			src[i] = (uint8_t)((i / 64) % 3 == 0 ? 0 : i % 7);
		packed = ps_lz4_pack(src, len, dst, cap);
		if (len >= 100) {
			ck_assert_uint_gt(packed, 0);
			ck_assert_uint_lt(packed, len);
			uint8_t *p = dup_exact(dst, packed);
			ck_assert_int_eq(ps_lz4_unpack(p, packed, back, len, err, sizeof(err)), 0);
			req(memcmp(src, back, len) == 0);
			/* a block or an expansion past LZ4's 2 GiB is refused as
			 * such, before anything is read (cast to int, 4 GiB + n
			 * would read as n: this very block) */
			for (int k = 0; k < 2; k++) {
				size_t big = (size_t)1 << 32;
				err[0] = '\0';
				ck_assert_int_ne(ps_lz4_unpack(p, packed + (k ? 0 : big), back,
							       len + (k ? big : 0), err, sizeof(err)),
						 0);
				ck_assert_msg(strstr(err, "beyond the 2 GiB limit of LZ4 blocks"), "%s",
					      err);
			}
			free(p);
		} else {
			ck_assert_uint_eq(packed, 0);   /* too short to shrink */
		}
		/* Random bytes do not shrink: 0, send raw. */
		for (size_t i = 0; i < len; i++)
			src[i] = (uint8_t)next_u64();
		ck_assert_uint_eq(ps_lz4_pack(src, len, dst, cap), 0);
		free(src);
		free(dst);
		free(back);
	}
	ck_assert_uint_eq(ps_lz4_pack("", 0, NULL, 0), 0);
	/* cap is the caller's buffer: never written past, even by a result
	 * that would not shrink and is dropped. Inputs found by search whose
	 * LZ4 block is exactly as long as they are (or one byte longer), packed
	 * into buffers of len - 1 and len bytes with guard bytes after */
	{
		enum { L = 300 };
		static uint8_t in[L], out[L + 64];
		int found = 0;
		uint64_t seed = 1;
		for (int tries = 0; tries < 200000 && found < 2; tries++) {
			/* random bytes with a repeated run whose length varies */
			int run = (int)(seed % 40);
			for (int i = 0; i < L; i++) {
				seed = seed * 6364136223846793005ull + 1442695040888963407ull;
				in[i] = i >= 100 && i < 100 + run ? in[i - 50] : (uint8_t)(seed >> 56);
			}
			int z = LZ4_compress_default((const char *)in, (char *)out, L, (int)sizeof(out));
			if (z != L && z != L + 1)
				continue;
			found++;
			for (size_t cap = L - 1; cap <= L; cap++) {
				memset(out, 0xa5, sizeof(out));
				ck_assert_uint_eq(ps_lz4_pack(in, L, out, cap), 0);
				for (size_t i = cap; i < sizeof(out); i++)
					ck_assert_msg(out[i] == 0xa5, "a %d-byte block (LZ4: %d bytes) "
						      "packed into %zu bytes wrote byte %zu", L, z, cap, i);
			}
		}
		ck_assert_msg(found > 0, "no input of %d bytes whose LZ4 block is as long found", L);
	}
	/* the bound is LZ4's own, neither less (an overflow) nor more */
	const int bl[] = { 0, 1, 254, 255, 256, 4096, 1 << 20, LZ4_MAX_INPUT_SIZE };
	for (size_t i = 0; i < sizeof(bl) / sizeof(bl[0]); i++)
		ck_assert_uint_eq(ps_lz4_bound((size_t)bl[i]), (size_t)LZ4_COMPRESSBOUND(bl[i]));
}
END_TEST

/* Every codec and the LZ4 stage free what they allocate: 300 rounds of
 * encode, decode and decode_add leave the heap where it was (a leak of
 * even one small buffer per call shows as kilobytes). */
START_TEST(test_no_leaks)
{
	enum { N = 5000, ROUNDS = 300 };
	struct ps_codec_params p = { .ratio = 0.05f, .seed = 7 };
	float *x = gradient(N, 1.0f), *r = fvec(N), *out = fvec(N);
	size_t cap = 0;

	for (int k = 0; k < PS_CODEC_COUNT; k++) {
		size_t m = ps_codec_get((enum ps_codec_kind)k)->max_bytes(N, &p);
		cap = m > cap ? m : cap;
	}
	uint8_t *e = malloc(cap), *z = malloc(ps_lz4_bound(cap)), *back = malloc(cap);
	char err[256];
	for (int pass = 0; pass < 2; pass++) { /* the first warms the allocator's caches */
		struct mallinfo2 m0 = mallinfo2();
		for (int round = 0; round < ROUNDS; round++)
			for (int k = 0; k < PS_CODEC_COUNT; k++) {
				const struct ps_codec_ops *c = ps_codec_get((enum ps_codec_kind)k);
				ssize_t len = c->encode(x, c->lossy_ef ? r : NULL, N, &p, (uint64_t)round,
							e, cap);
				ck_assert_int_gt(len, 0);
				ck_assert_int_eq(c->decode(e, (size_t)len, N, out, err, sizeof(err)), 0);
				ck_assert_int_eq(c->decode_add(e, (size_t)len, N, 1.0f, out, err,
							       sizeof(err)), 0);
				size_t packed = ps_lz4_pack(e, (size_t)len, z, ps_lz4_bound((size_t)len));
				if (packed)
					ck_assert_int_eq(ps_lz4_unpack(z, packed, back, (size_t)len, err,
								       sizeof(err)), 0);
			}
		struct mallinfo2 m1 = mallinfo2();
		if (pass == 1)
			ck_assert_msg(m1.uordblks <= m0.uordblks + 4096, "the heap grew by %zu bytes "
				      "over %d rounds of every codec", m1.uordblks - m0.uordblks, ROUNDS);
	}
	free(e);
	free(z);
	free(back);
	free(x);
	free(r);
	free(out);
}
END_TEST

/* The reference: round to nearest even in double, saturate finite values. */
static float fp16_ref(float f)
{
	double a = fabs((double)f), q;
	int e;

	if (isnan(f) || isinf(f))
		return f;
	if (a >= 65520.0)
		return copysignf(65504.0f, f);
	if (a < 0x1p-14)
		q = nearbyint(a * 0x1p24) * 0x1p-24;
	else {
		frexp(a, &e);   /* a = m * 2^e, m in [0.5, 1) */
		q = nearbyint(ldexp(a, 11 - e)) * ldexp(1.0, e - 11);
	}
	return copysignf((float)q, f);
}

/* A value exactly halfway between two halves near f (|f| < 65504): the
 * reference's rounding of f plus half a half-ulp, same sign. */
static float fp16_tie(float f)
{
	double a = fabs((double)fp16_ref(f)), ulp;
	int e;

	if (a < 0x1p-14)
		ulp = 0x1p-24;
	else {
		frexp(a, &e);
		ulp = ldexp(1.0, e - 11);
	}
	return copysignf((float)(a + ulp / 2), f);
}

START_TEST(test_fp16_specials_and_bound)
{
	static const float in[] = { 0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65505.0f, 65519.0f,
				    65520.0f, 1e10f, -1e10f, 0x1p-14f, 0x1p-24f, 0x1p-25f,
				    0x3p-25f, 0x1p-26f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
				    3.4e38f };
	static const float want[] = { 0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65504.0f, 65504.0f,
				      65504.0f, 65504.0f, -65504.0f, 0x1p-14f, 0x1p-24f, 0.0f,
				      0x1p-23f, 0.0f, 1.0f, 1.0f + 0x1p-9f, 65504.0f };
	const size_t m = sizeof(in) / sizeof(in[0]);
	uint16_t h[32];
	float back[32];

	for (int simd = 0; simd <= 1; simd++) {
		ps__fp16_pack(in, NULL, m, h, simd);
		ps__fp16_unpack(h, m, 1.0f, back, 0, simd);
		for (size_t i = 0; i < m; i++)
			req_msg(fbits(back[i]) == fbits(want[i]), "simd %d: %a -> %a, want %a",
				      simd, (double)in[i], (double)back[i], (double)want[i]);
		/* inf stays inf, NaN stays NaN. */
		float sp[3] = { INFINITY, -INFINITY, NAN };
		ps__fp16_pack(sp, NULL, 3, h, simd);
		ck_assert_uint_eq(h[0], 0x7c00);
		ck_assert_uint_eq(h[1], 0xfc00);
		req((h[2] & 0x7c00) == 0x7c00 && (h[2] & 0x3ff) != 0);
	}
	/* The stated bound on random values of every magnitude (every fourth one
	 * an exact tie between two halves, so rounding to even is exercised),
	 * through the codec and through each conversion path by name: the
	 * portable one always, F16C where the CPU has it. */
	const struct ps_codec_ops *c = ps_codec_find("fp16");
	if (!ps__fp16_have_simd())
		printf("check_codec: no F16C on this CPU: simd 1 runs the portable path too\n");
	for (size_t s = 0; s < NSIZES; s++) {
		size_t n = sizes[s], len;
		float *x = fvec(n), *d;
		uint16_t *h = malloc(n ? 2 * n : 1);
		uint8_t *e;

		ck_assert_ptr_nonnull(h);
		for (size_t i = 0; i < n; i++) {
			x[i] = (float)((urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 46) - 28));
			if (i % 4 == 3 && fabsf(x[i]) < 65504.0f)
				x[i] = fp16_tie(x[i]);
		}
		for (int path = 0; path < 3; path++) {  /* codec, portable, F16C */
			static const char *const names[] = { "codec", "portable", "F16C" };

			if (path == 0) {
				e = enc(c, x, NULL, n, NULL, 0, &len);
				ck_assert_uint_eq(len, 2 * n);
				d = dec(c, e, len, n);
				free(e);
			} else {
				d = fvec(n);
				ps__fp16_pack(x, NULL, n, h, path - 1);
				ps__fp16_unpack(h, n, 1.0f, d, 0, path - 1);
			}
			for (size_t i = 0; i < n; i++) {
				float a = fabsf(x[i]), err = fabsf(d[i] - x[i]);

				req_msg(fbits(d[i]) == fbits(fp16_ref(x[i])), "%s: %a -> %a, want %a",
					names[path], (double)x[i], (double)d[i],
					(double)fp16_ref(x[i]));
				if (a > 65504.0f)
					req(fabsf(d[i]) == 65504.0f);
				else if (a >= 0x1p-14f)
					req_msg(err <= 0x1p-11f * a, "%s: %a -> %a", names[path],
						(double)x[i], (double)d[i]);
				else
					req(err <= 0x1p-25f);
			}
			free(d);
		}
		free(h);
		free(x);
	}
}
END_TEST

/* The F16C and portable paths give the same bits, over a stride of all
 * floats and every half. */
START_TEST(test_fp16_paths_agree)
{
	enum { CH = 1 << 16 };
	float *f = fvec(CH), *a = fvec(CH), *b = fvec(CH);
	uint16_t *h1 = malloc(CH * 2), *h2 = malloc(CH * 2);
	uint64_t u = 0;

	req(h1 && h2);
	if (!ps__fp16_have_simd())
		fprintf(stderr, "check_codec: no F16C on this CPU, both paths are portable\n");
	while (u <= 0xffffffffull) {
		for (int i = 0; i < CH; i++, u += 251)
			f[i] = bitsf((uint32_t)u);
		ps__fp16_pack(f, NULL, CH, h1, 0);
		ps__fp16_pack(f, NULL, CH, h2, 1);
		for (int i = 0; i < CH; i++)
			req_msg(h1[i] == h2[i], "%08x: %04x vs %04x", fbits(f[i]), h1[i], h2[i]);
	}
	for (int i = 0; i < CH; i++)
		h1[i] = (uint16_t)i;
	ps__fp16_unpack(h1, CH, 1.0f, a, 0, 0);
	ps__fp16_unpack(h1, CH, 1.0f, b, 0, 1);
	for (int i = 0; i < CH; i++)
		req_msg(fbits(a[i]) == fbits(b[i]), "%04x: %08x vs %08x", i, fbits(a[i]), fbits(b[i]));
	/* Every non-NaN half survives float and back. */
	ps__fp16_pack(a, NULL, CH, h2, 0);
	for (int i = 0; i < CH; i++)
		if (!isnan(a[i]))
			req(h2[i] == h1[i]);
	free(f);
	free(a);
	free(b);
	free(h1);
	free(h2);
}
END_TEST

START_TEST(test_q8_bound_and_reproducible)
{
	const struct ps_codec_ops *c = ps_codec_find("q8");
	struct ps_codec_params p = { .seed = 42 };

	for (size_t s = 0; s < NSIZES; s++) {
		size_t n = sizes[s], len, len2;
		float *x = gradient(n, 0.01f), *d, mx = 0, step;
		uint8_t *e, *e2;

		for (size_t i = 0; i < n; i++)
			mx = fmaxf(mx, fabsf(x[i]));
		e = enc(c, x, NULL, n, &p, 7, &len);
		ck_assert_uint_eq(len, 4 + n);
		req(ps__ld_f32(e) == mx);
		step = mx / 127.0f;
		d = dec(c, e, len, n);
		for (size_t i = 0; i < n; i++) {
			req(((int8_t *)e)[4 + i] != -128);
			req_msg(fabsf(d[i] - x[i]) <= step * 1.0001f, "[%zu] %g vs %g", i,
				      (double)d[i], (double)x[i]);
		}
		/* Same (seed, nonce): same bytes; another nonce or seed: others. */
		e2 = enc(c, x, NULL, n, &p, 7, &len2);
		req(len2 == len && memcmp(e, e2, len) == 0);
		free(e2);
		if (n >= 1000) {
			e2 = enc(c, x, NULL, n, &p, 8, &len2);
			req(memcmp(e, e2, len) != 0);
			free(e2);
			p.seed++;
			e2 = enc(c, x, NULL, n, &p, 7, &len2);
			req(memcmp(e, e2, len) != 0);
			free(e2);
			p.seed--;
		}
		free(e);
		free(d);
		free(x);
	}
	/* The scalar tail (quant1, hash32) rounds as the 4-wide loop does:
	 * 1003 values (3 in the tail) and the same with a 0 after them (the
	 * same scale, all 1004 in the loop) give the same 1003 bytes, for 64
	 * nonces (each tail value's rounding drawn 64 times). */
	{
		float *x = gradient(1004, 0.01f);
		x[1003] = 0.0f;
		for (uint64_t nonce = 0; nonce < 64; nonce++) {
			size_t l3, l4;
			uint8_t *e3 = enc(c, x, NULL, 1003, &p, nonce, &l3);
			uint8_t *e4 = enc(c, x, NULL, 1004, &p, nonce, &l4);
			req(l3 == 4 + 1003 && l4 == 4 + 1004);
			for (int i = 0; i < 4 + 1003; i++)
				req_msg(e3[i] == e4[i], "nonce %d, byte %d: %d in the tail, %d in "
					"the loop", (int)nonce, i, (int)(int8_t)e3[i],
					(int)(int8_t)e4[i]);
			free(e3);
			free(e4);
		}
		free(x);
	}
	/* An all-zero slice: scale 0, zeros. */
	float z[9] = { 0 };
	size_t len;
	uint8_t *e = enc(c, z, NULL, 9, &p, 1, &len);
	float *d = dec(c, e, len, 9);
	req(ps__ld_f32(e) == 0.0f);
	for (int i = 0; i < 9; i++)
		req(d[i] == 0.0f);
	free(e);
	free(d);
	/* Values so small that their step (max / 127) is 0: zeros are sent and
	 * every value, the first and the last too, stays in the residual,
	 * added to what it held (error feedback loses nothing). */
	float tiny[9], res[9];
	for (int i = 0; i < 9; i++) {
		tiny[i] = (i % 2 ? -1.0f : 1.0f) * 1e-45f * (float)(1 + i % 3);
		res[i] = (float)i * 1e-45f;
	}
	e = enc(c, tiny, res, 9, &p, 1, &len);
	d = dec(c, e, len, 9);
	for (int i = 0; i < 9; i++) {
		req_msg(d[i] == 0.0f, "[%d] decoded %g", i, (double)d[i]);
		req_msg(res[i] == tiny[i] + (float)i * 1e-45f, "[%d] residual %g, expected %g", i,
			(double)res[i], (double)(tiny[i] + (float)i * 1e-45f));
	}
	free(e);
	free(d);
}
END_TEST

/* Averaged over many nonces the decoded values approach x: no bias. */
START_TEST(test_q8_unbiased)
{
	const struct ps_codec_ops *c = ps_codec_find("q8");
	struct ps_codec_params p = { .seed = 3 };
	enum { N = 1003, T = 4000 }; /* 1003: the scalar tail (quant1) too */
	float *x = gradient(N, 1.0f), step, mx = 0;
	double *sum = calloc(N, sizeof(double));
	uint8_t *e = malloc(c->max_bytes(N, &p));
	float *d = fvec(N);
	char err[64];

	req(sum && e);
	for (int i = 0; i < N; i++)
		mx = fmaxf(mx, fabsf(x[i]));
	step = mx / 127.0f;
	for (int t = 0; t < T; t++) {
		ck_assert_int_eq(c->encode(x, NULL, N, &p, (uint64_t)t, e, c->max_bytes(N, &p)),
				 4 + N);
		ck_assert_int_eq(c->decode(e, 4 + N, N, d, err, sizeof(err)), 0);
		for (int i = 0; i < N; i++)
			sum[i] += d[i];
	}
	/* Each draw is off by at most step, with sd <= step / 2: the mean of T
	 * draws has sd <= step / (2 sqrt(T)); allow 5 of those. */
	for (int i = 0; i < N; i++)
		req_msg(fabs(sum[i] / T - x[i]) <= 5.0 * step / (2.0 * sqrt(T)),
			      "[%d] mean %g, x %g, step %g", i, sum[i] / T, (double)x[i],
			      (double)step);
	free(sum);
	free(e);
	free(d);
	free(x);
}
END_TEST

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x < y) - (x > y);
}

/* Reads the indices of a topk payload (u32 count, count f32 values, count
 * LEB128 gaps) independently of the codec; returns the bytes they used. */
static size_t topk_indices(const uint8_t *e, size_t len, size_t k, uint32_t *idx)
{
	size_t pos = 4 + 4 * k;
	uint64_t prev = 0;

	for (size_t j = 0; j < k; j++) {
		uint64_t v = 0;
		int sh = 0;

		do {
			req_msg(pos < len, "varint %zu runs past the payload", j);
			v |= (uint64_t)(e[pos] & 0x7f) << sh;
			sh += 7;
		} while (e[pos++] & 0x80);
		prev = j ? prev + 1 + v : v;
		idx[j] = (uint32_t)prev;
	}
	return pos;
}

/* topk sends exactly k values, those of largest magnitude, with increasing
 * indices and exact values, in fewer bytes than 8 per value when the gaps
 * are short. */
static void check_topk(const float *x, size_t n, float ratio, size_t want_k)
{
	const struct ps_codec_ops *c = ps_codec_find("topk");
	struct ps_codec_params p = { .ratio = ratio };
	size_t len, k;
	uint8_t *e = enc(c, x, NULL, n, &p, 0, &len);
	float *mag = fvec(n), *d, kth;
	uint8_t *sent = calloc(n ? n : 1, 1);
	uint32_t *idx = malloc((n ? n : 1) * sizeof(uint32_t));

	ck_assert_ptr_nonnull(sent);
	ck_assert_ptr_nonnull(idx);
	k = ps__ld_u32(e);
	ck_assert_uint_eq(k, want_k);
	ck_assert_uint_eq(topk_indices(e, len, k, idx), len);
	ck_assert_uint_ge(len, 4 + 5 * k);
	ck_assert_uint_le(len, c->max_bytes(n, &p));
	if (k > 100 && k * 100 >= n) /* gaps of about 100: mostly one byte */
		ck_assert_uint_lt(len, 4 + 6 * k);
	for (size_t i = 0; i < n; i++)
		mag[i] = fabsf(x[i]);
	qsort(mag, n, sizeof(float), cmp_desc);
	kth = k ? mag[k - 1] : INFINITY;
	for (size_t j = 0; j < k; j++) {
		uint32_t ix = idx[j];

		req_msg(ix < n && (j == 0 || ix > idx[j - 1]), "index %u at %zu", ix, j);
		req(fbits(ps__ld_f32(e + 4 + 4 * j)) == fbits(x[ix]));
		req(fabsf(x[ix]) >= kth);
		sent[ix] = 1;
	}
	for (size_t i = 0; i < n; i++)
		if (!sent[i])
			req_msg(fabsf(x[i]) <= kth, "unsent [%zu] %g above the k-th %g", i,
				      (double)x[i], (double)kth);
	d = dec(c, e, len, n);
	for (size_t i = 0; i < n; i++)
		req(fbits(d[i]) == (sent[i] ? fbits(x[i]) : 0));
	free(d);
	free(idx);
	free(sent);
	free(mag);
	free(e);
}

START_TEST(test_topk_selection)
{
	/* k as the header states it; 0.1 of 10 is 1 despite 0.1f > 0.1. */
	for (size_t s = 0; s < NSIZES; s++) {
		size_t n = sizes[s];
		float *x = gradient(n, 1.0f);

		check_topk(x, n, 0.01f, n == 1000003 ? 10001 : (n ? 1 : 0));
		check_topk(x, n, 0.5f, (n + 1) / 2);
		check_topk(x, n, 1.0f, n);
		/* Ties: few distinct magnitudes, lots of zeros (sparse rows). */
		for (size_t i = 0; i < n; i++)
			x[i] = (float)((int)(urand() * 7) - 3) * (urand() < 0.7 ? 0.0f : 1.0f);
		check_topk(x, n, 0.01f, n == 1000003 ? 10001 : (n ? 1 : 0));
		check_topk(x, n, 0.2f, (size_t)ceil(0.2 * (double)n - 1e-9));
		free(x);
	}
	float ten[10] = { 1, -9, 3, 4, 5, 6, 7, 8, 2, 0 };
	check_topk(ten, 10, 0.1f, 1);
	check_topk(ten, 10, 0.3f, 3);
	/* Sizes that take the sampled threshold, with skewed data. */
	for (size_t n = 65536; n <= 700000; n = n * 3 + 17) {
		float *x = gradient(n, 1.0f);

		for (size_t i = 0; i < n; i += 97)
			x[i] *= 1000.0f;
		check_topk(x, n, 0.001f, (size_t)ceil(0.001f * (double)n - 1e-6));
		check_topk(x, n, 0.05f, (size_t)ceil(0.05f * (double)n - 1e-3));
		memset(x, 0, n * sizeof(float));
		check_topk(x, n, 0.01f, (size_t)ceil(0.01f * (double)n - 1e-3));
		free(x);
	}
}
END_TEST

/* The sampled threshold overshooting: the large magnitudes sit exactly at
 * the positions the codec samples (codec_topk.c: the hashed positions of
 * ps__fmix64), so the threshold it draws passes all but about 4,096
 * elements, fewer than k; the pass must be repeated with every element a
 * candidate and still send exactly the k largest. With a residual the
 * spikes are in the residual: the payload must equal the plain encode of
 * x + residual, and the residual become 0 where sent and x + r elsewhere. */
START_TEST(test_topk_sample_overshoot)
{
	const struct ps_codec_ops *c = ps_codec_find("topk");
	const size_t n = 65536; /* 16 x 4,096 samples: the smallest size sampled */
	struct ps_codec_params p = { .ratio = 0.125f }; /* k = n / 8, the most sampled */
	float *x = gradient(n, 1.0f), *r = fvec(n), *v = fvec(n);
	uint8_t *e, *e2;
	size_t len, len2, k = n / 8, spikes = 0;

	memset(r, 0, n * sizeof(float));
	for (size_t j = 0; j < 4096; j++) {
		size_t i = (size_t)(((unsigned __int128)ps__fmix64(j + 1) * n) >> 64);

		spikes += r[i] == 0.0f;
		r[i] = (j & 1) ? 1000.0f : -1000.0f;
	}
	req_msg(spikes < k, "%zu distinct sampled positions, %zu due below k", spikes, k);
	for (size_t i = 0; i < n; i++)
		v[i] = x[i] + r[i];
	check_topk(v, n, p.ratio, k);   /* the plain path */
	e = enc(c, v, NULL, n, &p, 0, &len);
	e2 = enc(c, x, r, n, &p, 0, &len2);   /* with error feedback */
	req_msg(len2 == len && memcmp(e, e2, len) == 0,
		"topk with a residual: %zu bytes, not those of x + residual (%zu)", len2, len);
	{
		float *d = dec(c, e, len, n);
		for (size_t i = 0; i < n; i++)
			req_msg(fbits(r[i]) == (d[i] != 0.0f ? fbits(0.0f) : fbits(v[i])),
				"residual [%zu] %g after the encode (sent %g, x + r %g)", i,
				(double)r[i], (double)d[i], (double)v[i]);
		free(d);
	}
	free(e);
	free(e2);
	free(x);
	free(r);
	free(v);
}
END_TEST

START_TEST(test_topk_bad_params)
{
	const struct ps_codec_ops *c = ps_codec_find("topk");
	float x[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	uint8_t out[128];
	struct ps_codec_params p = { .ratio = 0.0f };

	ck_assert_int_eq(c->encode(x, NULL, 8, &p, 0, out, sizeof(out)), -EINVAL);
	p.ratio = 1.5f;
	ck_assert_int_eq(c->encode(x, NULL, 8, &p, 0, out, sizeof(out)), -EINVAL);
	p.ratio = NAN;
	ck_assert_int_eq(c->encode(x, NULL, 8, &p, 0, out, sizeof(out)), -EINVAL);
	ck_assert_uint_ge(c->max_bytes(8, &p), 4 + 8 * 8);   /* never fails */
	ck_assert_int_eq(c->encode(x, NULL, 8, NULL, 0, out, sizeof(out)), -EINVAL);
	p.ratio = 0.5f;
	/* 4 values: count, 4 floats, 4 one-byte gaps; room is asked for the
	 * longest varints (5 bytes each) */
	ck_assert_uint_eq(c->max_bytes(8, &p), 4 + 4 * 4 + 5 * 4);
	ck_assert_int_eq(c->encode(x, NULL, 8, &p, 0, out, 4 + 4 * 4 + 5 * 4 - 1), -ENOBUFS);
	ck_assert_int_eq(c->encode(x, NULL, 8, &p, 0, out, 4 + 4 * 4 + 5 * 4), 4 + 4 * 4 + 4);
}
END_TEST

/* Every codec refuses an output buffer one byte shorter than max_bytes
 * with -ENOBUFS (a negative code: callers test e < 0), writes nothing
 * there, and leaves the error-feedback residual as it was, so nothing of
 * the gradient is lost; with max_bytes it encodes. */
START_TEST(test_encode_short_buffer)
{
	static const char *const names[] = { "none", "fp16", "q8", "topk", "sign" };
	struct ps_codec_params p = { .ratio = 0.25f, .seed = 7 };
	float x[64], resid[64], before[64];
	uint8_t out[1024];

	for (int i = 0; i < 64; i++) {
		x[i] = (float)((i * 37) % 23) - 11.0f;
		resid[i] = before[i] = 0.125f * (float)(i % 5);
	}
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		const struct ps_codec_ops *c = ps_codec_find(names[k]);
		size_t need;
		ck_assert_ptr_nonnull(c);
		need = c->max_bytes(64, &p);
		ck_assert_uint_le(need, sizeof(out));
		memset(out, 0xa5, sizeof(out));
		ck_assert_msg(c->encode(x, resid, 64, &p, 1, out, need - 1) == -ENOBUFS,
			      "%s: a buffer of max_bytes - 1 not refused with -ENOBUFS", names[k]);
		for (size_t i = 0; i < sizeof(out); i++)
			ck_assert_msg(out[i] == 0xa5, "%s: wrote byte %zu of a refused buffer",
				      names[k], i);
		ck_assert_msg(!memcmp(resid, before, sizeof(resid)),
			      "%s: residual changed by a refused encode", names[k]);
		ck_assert_msg(c->encode(x, resid, 64, &p, 1, out, need) > 0,
			      "%s: max_bytes not enough", names[k]);
		memcpy(resid, before, sizeof(resid));
	}
}
END_TEST

START_TEST(test_sign_values)
{
	const struct ps_codec_ops *c = ps_codec_find("sign");

	for (size_t s = 0; s < NSIZES; s++) {
		size_t n = sizes[s], len;
		float *x = gradient(n, 2.0f), *d;
		double sum = 0;
		uint8_t *e;

		if (n > 2)
			x[2] = -0.0f;
		for (size_t i = 0; i < n; i++)
			sum += fabsf(x[i]);
		e = enc(c, x, NULL, n, NULL, 0, &len);
		ck_assert_uint_eq(len, 4 + (n + 7) / 8);
		/* mean |x|, summed in float blocks: within a few ulps. */
		req(fabs(ps__ld_f32(e) - (n ? sum / (double)n : 0.0)) <= 1e-6 * sum / (double)(n ? n : 1));
		if (n % 8)
			ck_assert_uint_eq(e[len - 1] >> (n % 8), 0);
		d = dec(c, e, len, n);
		for (size_t i = 0; i < n; i++)
			req(d[i] == (signbit(x[i]) ? -ps__ld_f32(e) : ps__ld_f32(e)));
		free(e);
		free(d);
		free(x);
	}
}
END_TEST

/* Over 200 steps, what was sent plus what is left equals what was given. */
static void check_ef(const char *name, size_t n, float ratio)
{
	const struct ps_codec_ops *c = ps_codec_find(name);
	struct ps_codec_params p = { .ratio = ratio, .seed = 9 };
	double *raw = calloc(n, sizeof(double)), *sent = calloc(n, sizeof(double));
	double *absum = calloc(n, sizeof(double)), worst = 0;
	float *r = fvec(n), *x;
	size_t len;

	req(raw && sent && absum);
	memset(r, 0, n * sizeof(float));
	for (int t = 0; t < 200; t++) {
		float sd = (float)(0.1 + urand());
		uint8_t *e;
		float *d;

		x = gradient(n, sd);
		for (size_t i = 0; i < n; i++) {
			raw[i] += x[i];
			absum[i] += fabsf(x[i]);
		}
		e = enc(c, x, r, n, &p, (uint64_t)t, &len);
		d = dec(c, e, len, n);
		for (size_t i = 0; i < n; i++)
			sent[i] += d[i];
		free(d);
		free(e);
		free(x);
	}
	for (size_t i = 0; i < n; i++) {
		double gap = fabs(sent[i] + r[i] - raw[i]);
		double tol = 1e-5 * (absum[i] + fabs(r[i])) + 1e-6;

		req_msg(gap <= tol, "%s [%zu]: sent %g + residual %g vs raw %g", name, i,
			      sent[i], (double)r[i], raw[i]);
		worst = fmax(worst, gap / tol);
	}
	free(raw);
	free(sent);
	free(absum);
	free(r);
}

START_TEST(test_error_feedback)
{
	static const char *names[] = { "topk", "sign", "q8", "fp16", "none" };
	static const size_t ns[] = { 1, 9, 1000, 70001 };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		for (size_t j = 0; j < sizeof(ns) / sizeof(ns[0]); j++)
			check_ef(names[i], ns[j], 0.01f);
}
END_TEST

/* Non-finite input: lossy codecs refuse it and keep the residual. */
START_TEST(test_encode_nonfinite)
{
	static const char *names[] = { "topk", "sign", "q8" };
	struct ps_codec_params p = { .ratio = 0.1f };

	for (size_t i = 0; i < 3; i++) {
		const struct ps_codec_ops *c = ps_codec_find(names[i]);
		size_t n = 100003;
		float *x = gradient(n, 1.0f), *r = gradient(n, 1.0f), *r0 = fvec(n);
		uint8_t *out = malloc(c->max_bytes(n, &p));

		memcpy(r0, r, n * sizeof(float));
		for (int k = 0; k < 2; k++) {
			x[n / 2 + (size_t)k] = k ? INFINITY : NAN;
			ck_assert_int_eq(c->encode(x, r, n, &p, 0, out, c->max_bytes(n, &p)),
					 PS_ENOFINITE);
			req(memcmp(r, r0, n * sizeof(float)) == 0);
			x[n / 2 + (size_t)k] = 0.0f;
		}
		free(x);
		free(r);
		free(r0);
		free(out);
	}
}
END_TEST

/* Decoding `bad` (copied to an exact-size buffer) must fail with PS_EPROTO
 * and a reason containing `why`, writing nothing. */
static void expect_reject(const char *name, const void *bad, size_t len, size_t n,
			  const char *why)
{
	const struct ps_codec_ops *c = ps_codec_find(name);
	float *acc = gradient(n, 1.0f), *acc0 = fvec(n);
	void *p = dup_exact(bad, len);
	char err[256] = "";

	memcpy(acc0, acc, n * sizeof(float));
	ck_assert_int_eq(c->decode_add(p, len, n, 1.0f, acc, err, sizeof(err)), PS_EPROTO);
	req_msg(strstr(err, why) != NULL, "%s: reason \"%s\" lacks \"%s\"", name, err, why);
	req(n == 0 || memcmp(acc, acc0, n * sizeof(float)) == 0);
	err[0] = 0;
	ck_assert_int_eq(c->decode(p, len, n, acc, err, sizeof(err)), PS_EPROTO);
	req_msg(strstr(err, why) != NULL, "%s: reason \"%s\" lacks \"%s\"", name, err, why);
	req(n == 0 || memcmp(acc, acc0, n * sizeof(float)) == 0);
	/* A NULL/0 err buffer is allowed. */
	ck_assert_int_eq(c->decode_add(p, len, n, 1.0f, acc, NULL, 0), PS_EPROTO);
	free(p);
	free(acc);
	free(acc0);
}

START_TEST(test_hostile_lengths)
{
	static const char *names[] = { "none", "fp16", "q8", "topk", "sign" };
	struct ps_codec_params p = { .ratio = 0.3f };

	for (size_t i = 0; i < 5; i++) {
		const struct ps_codec_ops *c = ps_codec_find(names[i]);

		for (size_t s = 0; s < NSIZES; s++) {
			size_t n = sizes[s], len;
			float *x = gradient(n, 1.0f);
			uint8_t *e = enc(c, x, NULL, n, &p, 0, &len), *big = malloc(len + 1);

			ck_assert_ptr_nonnull(big);
			memcpy(big, e, len);
			big[len] = 0;
			if (len > 0)
				expect_reject(names[i], e, len - 1, n, "bytes");   /* truncated */
			expect_reject(names[i], big, len + 1, n, "bytes");         /* extra byte */
			if (len > 0)
				expect_reject(names[i], e, 0, n, "bytes");         /* empty */
			/* The right length for another n. */
			if (n > 0 && i != PS_CODEC_TOPK)
				expect_reject(names[i], e, len, n + 8, "bytes");
			free(big);
			free(e);
			free(x);
		}
	}
}
END_TEST

/* A topk payload: count, count values 1, 2, ..., then the varint bytes
 * given; returns its length. */
static size_t topk_payload(uint8_t *b, uint32_t count, const char *varints, size_t vlen)
{
	ps__st_u32(b, count);
	for (uint32_t i = 0; i < count && i < 8; i++)
		ps__st_f32(b + 4 + 4 * i, 1.0f + (float)i);
	memcpy(b + 4 + 4 * (count < 8 ? count : 8), varints, vlen);
	return 4 + 4 * (count < 8 ? count : 8) + vlen;
}

START_TEST(test_hostile_topk)
{
	uint8_t b[128];
	const uint32_t n = 300;
	size_t len;

	/* indices 1, 4, 200: gaps 1, 2, 195 (two bytes: c3 01) */
	len = topk_payload(b, 3, "\x01\x02\xc3\x01", 4);
	float *d = dec(ps_codec_find("topk"), b, len, n);
	req(d[1] == 1.0f && d[4] == 2.0f && d[200] == 3.0f && d[0] == 0.0f && d[199] == 0.0f);
	free(d);
	len = topk_payload(b, 3, "\x01\x02\xab\x02", 4); /* 4 + 1 + 299 = 304 */
	expect_reject("topk", b, len, n, "out of range");
	len = topk_payload(b, 3, "\x01\x02\xff\xff\xff\xff\x0f", 7); /* + 2^32 - 1 */
	expect_reject("topk", b, len, n, "out of range");
	len = topk_payload(b, 3, "\x01\x02\xff\xff\xff\xff\x1f", 7); /* > 32 bits */
	expect_reject("topk", b, len, n, "malformed");
	len = topk_payload(b, 3, "\x01\x02\x80\x80\x80\x80\x80\x01", 8); /* 6 bytes */
	expect_reject("topk", b, len, n, "malformed");
	len = topk_payload(b, 3, "\x01\x02\x81", 3); /* ends inside a varint */
	expect_reject("topk", b, len, n, "truncated");
	len = topk_payload(b, 3, "\x01\x02\xc3\x01\x00", 5); /* a byte too many */
	expect_reject("topk", b, len, n, "left after");
	len = topk_payload(b, 3, "\x01\x02", 2);         /* fewer varints than count */
	expect_reject("topk", b, len, n, "too short");
	len = topk_payload(b, 301, "", 0);                 /* count > n */
	expect_reject("topk", b, len, n, "exceeds");
	len = topk_payload(b, 0xffffffffu, "", 0);
	expect_reject("topk", b, len, n, "exceeds");
	len = topk_payload(b, 3, "\x01\x02\xc3\x01", 4);
	expect_reject("topk", b, 3, n, "shorter");
	expect_reject("topk", b, len, 0, "exceeds");      /* n = 0 */
	expect_reject("topk", b, len, 200, "out of range"); /* index 200 of 200 */
}
END_TEST

START_TEST(test_hostile_scales)
{
	static const float bad[] = { NAN, INFINITY, -INFINITY, -1.0f };
	uint8_t b[4 + 16];

	memset(b, 0, sizeof(b));
	for (int i = 0; i < 4; i++) {
		ps__st_f32(b, bad[i]);
		expect_reject("q8", b, 4 + 16, 16, "scale");
		expect_reject("sign", b, 4 + 2, 16, "scale");
		expect_reject("sign", b, 4 + 3, 17, "scale");
	}
	ps__st_f32(b, 1.0f);
	b[4 + 5] = 0x80;   /* -128 */
	expect_reject("q8", b, 4 + 16, 16, "-128");
	expect_reject("q8", b, 3, 0, "shorter");
	expect_reject("sign", b, 3, 0, "shorter");
	/* sign: bits past n must be 0. */
	memset(b + 4, 0, 16);
	b[4 + 2] = 0x02;   /* n = 17: only bit 0 of byte 2 is a value */
	expect_reject("sign", b, 4 + 3, 17, "padding");
	b[4 + 2] = 0x01;
	float *d = dec(ps_codec_find("sign"), b, 4 + 3, 17);
	req(d[16] == -1.0f && d[0] == 1.0f);
	free(d);
}
END_TEST

static void expect_lz4_reject(const void *src, size_t len, size_t expect, const char *why)
{
	void *p = dup_exact(src, len);
	uint8_t *dst = malloc(expect ? expect : 1);
	char err[256] = "";

	ck_assert_int_eq(ps_lz4_unpack(p, len, dst, expect, err, sizeof(err)), PS_EPROTO);
	req_msg(strstr(err, why) != NULL, "lz4: reason \"%s\" lacks \"%s\"", err, why);
	free(p);
	free(dst);
}

START_TEST(test_hostile_lz4)
{
	size_t len = 4000, packed;
	uint8_t *src = calloc(len, 1), *dst = malloc(ps_lz4_bound(len));
	uint8_t garbage[64];

	req(src && dst);
	for (size_t i = 0; i < len; i += 50)
		src[i] = (uint8_t)i;
	packed = ps_lz4_pack(src, len, dst, ps_lz4_bound(len));
	ck_assert_uint_gt(packed, 0);
	expect_lz4_reject(dst, packed, len - 1, "malformed");   /* expands to more */
	expect_lz4_reject(dst, packed, len + 1, "expands to 4000");
	expect_lz4_reject(dst, packed, 0, "malformed");
	expect_lz4_reject(dst, packed - 1, len, "malformed");   /* truncated */
	expect_lz4_reject(dst, 0, len, "empty");
	for (size_t i = 0; i < sizeof(garbage); i++)
		garbage[i] = (uint8_t)(0xf0 | i);
	expect_lz4_reject(garbage, sizeof(garbage), len, "malformed");
	/* Random garbage never crashes and never claims success wrongly. */
	for (int t = 0; t < 2000; t++) {
		char err[128];
		uint8_t out[256];

		for (size_t i = 0; i < sizeof(garbage); i++)
			garbage[i] = (uint8_t)next_u64();
		size_t gl = 1 + next_u64() % sizeof(garbage);
		void *p = dup_exact(garbage, gl);
		int rc = ps_lz4_unpack(p, gl, out, sizeof(out), err, sizeof(err));
		req(rc == 0 || rc == PS_EPROTO);
		free(p);
	}
	free(src);
	free(dst);
}
END_TEST

/* Codec output through the LZ4 stage and back is bit-exact. */
START_TEST(test_codec_then_lz4)
{
	struct ps_codec_params p = { .ratio = 0.01f, .seed = 1 };

	for (int k = 0; k < PS_CODEC_COUNT; k++) {
		const struct ps_codec_ops *c = ps_codec_get((enum ps_codec_kind)k);
		size_t n = 100000, len, packed;
		float *x = gradient(n, 1e-3f);
		uint8_t *e = enc(c, x, NULL, n, &p, 0, &len);
		uint8_t *z = malloc(ps_lz4_bound(len)), *back = malloc(len);
		char err[128];

		packed = ps_lz4_pack(e, len, z, ps_lz4_bound(len));
		if (packed) {
			ck_assert_uint_lt(packed, len);
			ck_assert_int_eq(ps_lz4_unpack(z, packed, back, len, err, sizeof(err)), 0);
			req(memcmp(back, e, len) == 0);
		}
		free(x);
		free(e);
		free(z);
		free(back);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("codec");
	TCase *tc = tcase_create("codec");
	int failed;

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_registry);
	tcase_add_test(tc, test_none_exact);
	tcase_add_test(tc, test_lz4_exact);
	tcase_add_test(tc, test_fp16_specials_and_bound);
	tcase_add_test(tc, test_fp16_paths_agree);
	tcase_add_test(tc, test_q8_bound_and_reproducible);
	tcase_add_test(tc, test_q8_unbiased);
	tcase_add_test(tc, test_topk_selection);
	tcase_add_test(tc, test_topk_sample_overshoot);
	tcase_add_test(tc, test_topk_bad_params);
	tcase_add_test(tc, test_encode_short_buffer);
	tcase_add_test(tc, test_sign_values);
	tcase_add_test(tc, test_error_feedback);
	tcase_add_test(tc, test_encode_nonfinite);
	tcase_add_test(tc, test_hostile_lengths);
	tcase_add_test(tc, test_hostile_topk);
	tcase_add_test(tc, test_hostile_scales);
	tcase_add_test(tc, test_hostile_lz4);
	tcase_add_test(tc, test_codec_then_lz4);
	tcase_add_test(tc, test_no_leaks);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
