/* codec_topk.c - the topk codec: the k = ceil(ratio * n) values of largest
 * magnitude, with their indices.
 *
 * Layout (little-endian): uint32 count, then count float32 values, then the
 * count indices (strictly increasing, < n) as gaps in LEB128 varints: the
 * first index itself, then each index minus the previous one minus 1. At
 * ratio 0.01 the gaps average 99, so most take one byte: about 5.3 bytes
 * per sent value instead of 8 with plain uint32 indices (75x fewer bytes
 * than float32 rather than 50x). Values come first so they stay 4-byte
 * aligned. Elements not listed decode as 0. The decoder accepts any
 * count <= n (it does not know the ratio) and requires the varints to end
 * exactly at the end of the payload; the encoder always sends exactly k.
 *
 * k: ceil(ratio * n) with ratio in (0, 1], at least 1 when n > 0. ratio
 * is a float, so 0.1f is 0.100000001; the product is lowered by a relative
 * 2^-23 before ceil() so that 0.1 of 10 values is 1, not 2.
 *
 * Selection in O(n) expected time, without sorting: a sample of 4096
 * magnitudes at hashed positions gives a threshold a little below the k-th
 * largest; one pass over the slice collects the candidates at or above it
 * (about 1.3 k of them), and a quickselect among those finds the exact
 * k-th largest magnitude T. Everything above T is sent, and ties at T go to
 * the lowest indices, so the result does not depend on the sample. Should
 * the sample overshoot (fewer than k candidates), the pass is repeated with
 * every element a candidate. Sent values are exact, so with a residual the
 * sent elements' residual becomes 0 and every other element's becomes
 * x + residual. Non-finite input gives PS_ENOFINITE with the residual as
 * it was; n above 2^32 - 1 does not fit the indices (PS_ETOOBIG).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "codec_int.h"
#include "ps_err.h"

#define TOPK_HDR 4
#define VARINT_MAX 5   /* bytes of a uint32 in LEB128 */
#define SAMPLES 4096
#define FLT_BIG 3.40282347e+38f

/* Candidates in increasing index order, and room for their magnitudes. */
struct cand {
	uint32_t *idx;
	float *val;     /* x + residual, signed */
	size_t len, cap;
};

static size_t topk_k(size_t n, const struct ps_codec_params *p)
{
	double prod, k;

	if (n == 0)
		return 0;
	if (!p || !(p->ratio > 0.0f && p->ratio <= 1.0f))
		return n;
	prod = (double)p->ratio * (double)n;
	k = ceil(prod - prod * 0x1p-23);
	if (k < 1.0)
		return 1;
	return k >= (double)n ? n : (size_t)k;
}

static size_t topk_max_bytes(size_t n, const struct ps_codec_params *p)
{
	size_t k = topk_k(n, p);

	if (k > (SIZE_MAX - TOPK_HDR) / (4 + VARINT_MAX))
		return SIZE_MAX;
	return TOPK_HDR + (4 + VARINT_MAX) * k;
}

/* Writes v as a LEB128 varint at o; returns the bytes written (1..5). */
static size_t put_varint(uint8_t *o, uint32_t v)
{
	size_t i = 0;

	while (v >= 0x80) {
		o[i++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	o[i++] = (uint8_t)v;
	return i;
}

/* Reads one varint of at most 5 bytes (a uint32) from [*p, end). 0, or -1
 * when it runs past end or does not fit 32 bits. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;

	for (int i = 0; i < VARINT_MAX; i++) {
		if (*p == end)
			return -1;
		uint8_t b = *(*p)++;
		x |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*v = x;
			return x > UINT32_MAX ? -1 : 0;
		}
	}
	return -1;
}

static inline void swapf(float *a, float *b)
{
	float t = *a;

	*a = *b;
	*b = t;
}

/* Reorders a[0..n) so that a[k] is what a sort in decreasing order would
 * put there, and returns it. Hoare partition around the median of three
 * pseudo-random elements: expected O(n) on any input, equal values
 * included (they split evenly instead of degrading to O(n^2)). */
static float select_desc(float *a, size_t n, size_t k)
{
	ptrdiff_t lo = 0, hi = (ptrdiff_t)n - 1, kk = (ptrdiff_t)k;
	uint64_t rng = 0x2545f4914f6cdd1dull;

	while (hi - lo >= 16) {
		ptrdiff_t span = hi - lo + 1, i = lo, j = hi;
		float p0, p1, p2, p;

		rng = ps__fmix64(rng + 1);
		p0 = a[lo + (ptrdiff_t)(rng % (uint64_t)span)];
		p1 = a[lo + (ptrdiff_t)((rng >> 21) % (uint64_t)span)];
		p2 = a[lo + (ptrdiff_t)((rng >> 42) % (uint64_t)span)];
		p = p0 > p1 ? (p1 > p2 ? p1 : (p0 > p2 ? p2 : p0)) : (p0 > p2 ? p0 : (p1 > p2 ? p2 : p1));
		while (i <= j) {
			while (a[i] > p)
				i++;
			while (a[j] < p)
				j--;
			if (i <= j)
				swapf(&a[i++], &a[j--]);
		}
		/* Now a[lo..j] >= p >= a[i..hi], and a[j+1..i-1] == p. */
		if (kk <= j)
			hi = j;
		else if (kk >= i)
			lo = i;
		else
			return a[kk];
	}
	for (ptrdiff_t i = lo + 1; i <= hi; i++) {   /* insertion sort, decreasing */
		float v = a[i];
		ptrdiff_t j = i - 1;

		for (; j >= lo && a[j] < v; j--)
			a[j + 1] = a[j];
		a[j + 1] = v;
	}
	return a[kk];
}

static int cand_push(struct cand *c, uint32_t i, float v)
{
	if (c->len == c->cap) {
		size_t ncap = c->cap * 2;
		uint32_t *idx = realloc(c->idx, ncap * sizeof(*idx));

		if (!idx)
			return -ENOMEM;
		c->idx = idx;
		float *val = realloc(c->val, ncap * sizeof(*val));
		if (!val)
			return -ENOMEM;
		c->val = val;
		c->cap = ncap;
	}
	c->idx[c->len] = i;
	c->val[c->len++] = v;
	return 0;
}

/* Appends every element with |x + residual| >= t (t < 0: all of them).
 * Inlined twice, with and without a residual, so the inner loop has no
 * test of it. Blocks of 8 are screened first: usually none qualifies. */
static inline __attribute__((always_inline)) int
collect(const float *x, const float *residual, size_t n, float t, struct cand *c)
{
	int bad = 0, rc;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		float v[8];
		int hit = 0;

		for (int j = 0; j < 8; j++) {
			float a;

			v[j] = residual ? x[i + j] + residual[i + j] : x[i + j];
			a = fabsf(v[j]);
			bad |= !(a <= FLT_BIG);
			hit |= a >= t;
		}
		if (!hit)
			continue;
		for (int j = 0; j < 8; j++)
			if (fabsf(v[j]) >= t && (rc = cand_push(c, (uint32_t)(i + j), v[j])))
				return rc;
	}
	for (; i < n; i++) {
		float v = residual ? x[i] + residual[i] : x[i];

		bad |= !(fabsf(v) <= FLT_BIG);
		if (fabsf(v) >= t && (rc = cand_push(c, (uint32_t)i, v)))
			return rc;
	}
	return bad ? PS_ENOFINITE : 0;
}

static int collect_ef(const float *x, const float *residual, size_t n, float t, struct cand *c)
{
	return collect(x, residual, n, t, c);
}

static int collect_plain(const float *x, size_t n, float t, struct cand *c)
{
	return collect(x, NULL, n, t, c);
}

/* A threshold with about k (plus a margin) of the n magnitudes at or above
 * it, from a sample; -1 (take all) when sampling would not pay. */
static float sample_threshold(const float *x, const float *residual, size_t n, size_t k,
			      float *buf)
{
	double e, r;
	size_t rank;

	if (n < 16 * SAMPLES || k > n / 8)
		return -1.0f;
	for (size_t j = 0; j < SAMPLES; j++) {
		size_t i = (size_t)(((unsigned __int128)ps__fmix64(j + 1) * n) >> 64);
		float a = fabsf(residual ? x[i] + residual[i] : x[i]);

		buf[j] = a <= FLT_BIG ? a : FLT_BIG;  /* NaN: the full pass reports it */
	}
	/* Expected sample count above the true k-th largest, plus 3 sigma. */
	e = (double)k * SAMPLES / (double)n;
	r = ceil(e + 3.0 * sqrt(e) + 2.0);
	rank = r >= SAMPLES ? SAMPLES : (size_t)r;
	return select_desc(buf, SAMPLES, rank - 1);
}

static ssize_t topk_encode(const float *x, float *residual, size_t n,
			   const struct ps_codec_params *p, uint64_t nonce, void *out, size_t cap)
{
	struct cand c = { 0 };
	size_t k, ngt = 0, ties, j = 0;
	char *o = out;
	float t, kth, *mag = NULL;
	ssize_t rc;

	(void)nonce;
	if (!p || !(p->ratio > 0.0f && p->ratio <= 1.0f))
		return -EINVAL;
	if (n > UINT32_MAX)
		return PS_ETOOBIG;
	k = topk_k(n, p);
	if (cap < topk_max_bytes(n, p))
		return -ENOBUFS;
	if (k == 0) {
		ps__st_u32(out, 0);
		return TOPK_HDR;
	}
	c.cap = n < 16 * SAMPLES || k > n / 8 ? n : k + k / 2 + 64;
	c.idx = malloc(c.cap * sizeof(*c.idx));
	c.val = malloc((c.cap > SAMPLES ? c.cap : SAMPLES) * sizeof(*c.val));
	if (!c.idx || !c.val) {
		rc = -ENOMEM;
		goto err_free_cand;
	}
	t = sample_threshold(x, residual, n, k, c.val);
	rc = residual ? collect_ef(x, residual, n, t, &c) : collect_plain(x, n, t, &c);
	if (rc == 0 && c.len < k) {   /* the sample overshot: take everything */
		c.len = 0;
		rc = residual ? collect_ef(x, residual, n, -1.0f, &c) : collect_plain(x, n, -1.0f, &c);
	}
	if (rc)
		goto err_free_cand;
	mag = malloc(c.len * sizeof(*mag));
	if (!mag) {
		rc = -ENOMEM;
		goto err_free_cand;
	}
	for (size_t i = 0; i < c.len; i++)
		mag[i] = fabsf(c.val[i]);
	kth = select_desc(mag, c.len, k - 1);
	for (size_t i = 0; i < c.len; i++)
		ngt += fabsf(c.val[i]) > kth;
	ties = k - ngt;
	/* Candidates are in index order, so the kept ones (moved to the front
	 * of c, j <= i) come out increasing. */
	for (size_t i = 0; i < c.len && j < k; i++) {
		float a = fabsf(c.val[i]);

		if (a > kth || (a == kth && ties > 0)) {
			ties -= a == kth;
			c.idx[j] = c.idx[i];
			c.val[j] = c.val[i];
			j++;
		}
	}
	ps__st_u32(o, (uint32_t)k);
	size_t pos = TOPK_HDR + 4 * k;
	for (size_t i = 0; i < k; i++) {
		ps__st_f32(o + TOPK_HDR + 4 * i, c.val[i]);
		pos += put_varint((uint8_t *)o + pos, i ? c.idx[i] - c.idx[i - 1] - 1 : c.idx[0]);
	}
	if (residual) {
		for (size_t i = 0; i < n; i++)
			residual[i] += x[i];
		for (size_t i = 0; i < k; i++)
			residual[c.idx[i]] = 0.0f;
	}
	rc = (ssize_t)pos;
	free(mag);
err_free_cand:
	free(c.idx);
	free(c.val);
	return rc;
}

/* Walks the payload: checks every length and index, and when acc is not
 * NULL adds scale * value at each index (or stores the value, for decode).
 * Checking completes before anything is written. */
static int topk_walk(const void *enc, size_t len, size_t n, char *err, size_t errlen,
		     float *out, float scale, int add)
{
	const uint8_t *e = enc, *p, *end = e + len;
	uint64_t ix = 0, gap;
	size_t cnt;

	if (len < TOPK_HDR)
		return ps__codec_fail(err, errlen, "topk: payload is %zu bytes, shorter than its "
				      "4-byte count", len);
	cnt = ps__ld_u32(e);
	if (cnt > n)
		return ps__codec_fail(err, errlen, "topk: count %zu exceeds the %zu values of the "
				      "slice", cnt, n);
	if (len - TOPK_HDR < 5 * (uint64_t)cnt)
		return ps__codec_fail(err, errlen, "topk: payload is %zu bytes, too short for "
				      "count %zu (at least %zu)", len, cnt, TOPK_HDR + 5 * cnt);
	for (int pass = 0; pass < (out ? 2 : 1); pass++) {
		p = e + TOPK_HDR + 4 * cnt;
		for (size_t i = 0; i < cnt; i++) {
			if (get_varint(&p, end, &gap))
				return ps__codec_fail(err, errlen, "topk: index %zu is a malformed "
						      "or truncated varint", i);
			ix = i ? ix + 1 + gap : gap;
			if (ix >= n)
				return ps__codec_fail(err, errlen, "topk: index %llu at position %zu "
						      "is out of range (n = %zu)",
						      (unsigned long long)ix, i, n);
			if (pass == 1) {
				float v = ps__ld_f32(e + TOPK_HDR + 4 * i);
				if (add)
					out[ix] += scale * v;
				else
					out[ix] = v;
			}
		}
		if (p != end)
			return ps__codec_fail(err, errlen, "topk: %zu bytes left after the %zu "
					      "indices", (size_t)(end - p), cnt);
		if (out && pass == 0 && !add)
			memset(out, 0, n * sizeof(float));
	}
	return 0;
}

static int topk_decode_add(const void *enc, size_t len, size_t n, float scale, float *acc,
			   char *err, size_t errlen)
{
	return topk_walk(enc, len, n, err, errlen, acc, scale, 1);
}

static int topk_decode(const void *enc, size_t len, size_t n, float *out, char *err,
		       size_t errlen)
{
	return topk_walk(enc, len, n, err, errlen, out, 1.0f, 0);
}

const struct ps_codec_ops ps__codec_topk = {
	.name = "topk",
	.kind = PS_CODEC_TOPK,
	.lossy_ef = 1,
	.max_bytes = topk_max_bytes,
	.encode = topk_encode,
	.decode_add = topk_decode_add,
	.decode = topk_decode,
};
