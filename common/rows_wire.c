/* rows_wire.c - row placement, initial values and the id coding of
 * embedding requests (rows_wire.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ps_err.h"
#include "rows_wire.h"
#include "shardmap.h"

/* splitmix64 finaliser. */
static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t ps_rows_table_key(const struct ps_table_cfg *t)
{
	return ps_fnv1a(PS_FNV_OFFSET, t->name, strlen(t->name));
}

int ps_rows_shard(uint64_t tkey, uint64_t id, int nshards)
{
	/* multiply-shift instead of a modulo: unbiased and cheap */
	return (int)(((unsigned __int128)mix64(id ^ mix64(tkey)) * (unsigned)nshards) >> 64);
}

/* Uniform in (0, 1) from the top 24 bits. */
static double unit(uint64_t r)
{
	return ((double)(r >> 40) + 0.5) / 16777216.0;
}

void ps_rows_init(const struct ps_config *cfg, int t, uint64_t id, float *out)
{
	const struct ps_table_cfg *tc = &cfg->tables[t];
	uint64_t base = mix64(cfg->seed ^ mix64(ps_rows_table_key(tc) ^ mix64(id)));

	for (int j = 0; j < tc->dim; j++) {
		uint64_t r = mix64(base + (uint64_t)j);
		switch (tc->init) {
		case PS_INIT_CONST:
			out[j] = tc->init_value;
			break;
		case PS_INIT_UNIFORM:
			out[j] = (float)((2.0 * unit(r) - 1.0) * tc->init_value);
			break;
		case PS_INIT_NORMAL: {
			double u1 = unit(r), u2 = unit(mix64(r));
			out[j] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) *
					 tc->init_value);
			break;
		}
		default:
			out[j] = 0.0f;
			break;
		}
	}
}

size_t ps_rows_ids_encode(const uint64_t *ids, size_t n, uint8_t *out)
{
	uint8_t *p = out;
	uint64_t prev = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t v = ids[i] - prev;
		prev = ids[i];
		while (v >= 0x80) {
			*p++ = (uint8_t)(v | 0x80);
			v >>= 7;
		}
		*p++ = (uint8_t)v;
	}
	return (size_t)(p - out);
}

int ps_rows_ids_decode(const uint8_t *in, size_t len, size_t n, uint64_t *ids, char *why,
		       size_t whylen)
{
	size_t pos = 0;
	uint64_t prev = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t v = 0;
		int shift = 0;
		for (;;) {
			uint8_t b;
			if (pos >= len) {
				snprintf(why, whylen, "ids end after %zu bytes, at id %zu of %zu", len, i, n);
				return PS_EPROTO;
			}
			b = in[pos++];
			if (shift == 63 && b > 1) {
				snprintf(why, whylen, "id %zu: varint past 2^64", i);
				return PS_EPROTO;
			}
			v |= (uint64_t)(b & 0x7f) << shift;
			if (!(b & 0x80)) {
				if (b == 0 && shift > 0) {
					/* one spelling per id list: no padded varints */
					snprintf(why, whylen, "id %zu: varint padded with a zero byte",
						 i);
					return PS_EPROTO;
				}
				break;
			}
			shift += 7;
			if (shift > 63) {
				snprintf(why, whylen, "id %zu: varint longer than %d bytes", i,
					 PS_VARINT_MAX);
				return PS_EPROTO;
			}
		}
		if (i > 0 && v == 0) {
			snprintf(why, whylen, "id %zu repeats id %" PRIu64 " (ids must be sorted and "
				 "unique)", i, prev);
			return PS_EPROTO;
		}
		if (v > UINT64_MAX - prev) {
			snprintf(why, whylen, "id %zu: past 2^64", i);
			return PS_EPROTO;
		}
		prev += v;
		ids[i] = prev;
	}
	if (pos != len) {
		snprintf(why, whylen, "%zu bytes after the %zu ids", len - pos, n);
		return PS_EPROTO;
	}
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int ps_rows_dedup(const uint64_t *ids, size_t n, uint64_t **uniq, size_t *nuniq,
		  uint32_t *where)
{
	uint64_t *u = malloc(sizeof(*u) * (n ? n : 1));
	size_t m = 0;

	if (!u)
		return -ENOMEM;
	memcpy(u, ids, sizeof(*u) * n);
	qsort(u, n, sizeof(*u), cmp_u64);
	for (size_t i = 0; i < n; i++)
		if (m == 0 || u[m - 1] != u[i])
			u[m++] = u[i];
	if (where)
		for (size_t i = 0; i < n; i++) {
			/* binary search: the position of ids[i] among the unique ids */
			size_t lo = 0, hi = m;
			while (hi - lo > 1) {
				size_t mid = (lo + hi) / 2;
				if (u[mid] <= ids[i])
					lo = mid;
				else
					hi = mid;
			}
			where[i] = (uint32_t)lo;
		}
	*uniq = u;
	*nuniq = m;
	return 0;
}
