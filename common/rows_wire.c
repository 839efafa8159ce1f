/* rows_wire.c - row placement, initial values and the id coding of
 * embedding requests (rows_wire.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "jump_hash.h"
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
	return ps_jump_hash(mix64(id ^ mix64(tkey)), nshards);
}

int ps_rows_shard_placed(uint64_t tkey, uint64_t id, int nshards, int placement)
{
	if (placement == PS_PLACE_GREEDY) /* multiply-shift: unbiased and cheap */
		return (int)(((unsigned __int128)mix64(id ^ mix64(tkey)) * (unsigned)nshards) >> 64);
	return ps_rows_shard(tkey, id, nshards);
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

struct keyed {
	uint64_t id;
	uint64_t at;            /* position in the caller's list */
};

/* Sorts n pairs by id: LSD radix sort, 11 bits a pass (6 passes, each
 * skipped when every id has the same digit there), tmp as scratch. Stable,
 * so equal ids keep their input order. */
static struct keyed *radix_sort(struct keyed *a, struct keyed *tmp, size_t n)
{
	enum { BITS = 11, NB = 1 << BITS };
	static _Thread_local size_t cnt[NB];

	for (int shift = 0; shift < 64; shift += BITS) {
		size_t sum = 0;
		memset(cnt, 0, sizeof(cnt));
		for (size_t i = 0; i < n; i++)
			cnt[(a[i].id >> shift) & (NB - 1)]++;
		if (cnt[(a[0].id >> shift) & (NB - 1)] == n)
			continue;
		for (size_t d = 0; d < NB; d++) {
			size_t c = cnt[d];
			cnt[d] = sum;
			sum += c;
		}
		for (size_t i = 0; i < n; i++)
			tmp[cnt[(a[i].id >> shift) & (NB - 1)]++] = a[i];
		struct keyed *t = a;
		a = tmp;
		tmp = t;
	}
	return a;
}

int ps_rows_dedup(const uint64_t *ids, size_t n, uint64_t **uniq, size_t *nuniq,
		  uint32_t *where)
{
	struct keyed *k = malloc(sizeof(*k) * (n ? n : 1) * 2), *sorted;
	uint64_t *u = malloc(sizeof(*u) * (n ? n : 1));
	size_t m = 0;

	if (!k || !u) {
		free(k);
		free(u);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		k[i] = (struct keyed){ ids[i], i };
	sorted = n ? radix_sort(k, k + n, n) : k;
	for (size_t i = 0; i < n; i++) {
		if (m == 0 || u[m - 1] != sorted[i].id)
			u[m++] = sorted[i].id;
		if (where)
			where[sorted[i].at] = (uint32_t)(m - 1);
	}
	free(k);
	*uniq = u;
	*nuniq = m;
	return 0;
}
