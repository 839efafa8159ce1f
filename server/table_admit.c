/* table_admit.c - the admission filter of an embedding table: how many
 * pushes named each id that has no row yet (table.h).
 *
 * 4 bytes per slot: a 24-bit fingerprint of the id and an 8-bit count.
 * Slots come in buckets of 8 (32 bytes, within one cache line); an id may
 * sit in one of two buckets, the second derived from the first and the
 * fingerprint (as in a cuckoo filter), so an entry never has to move.
 * When both buckets of a new id are full, every count in the filter is
 * halved (counts of 1 vanish): old rare ids make room for new ones, the
 * memory never grows, and an id loses at most half its sightings.
 *
 * Two ids with the same fingerprint in the same bucket share a count: such
 * an id is admitted early (never late), for about 16 in 2^24 ids.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "table.h"

#define BUCKET 8

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int ps_admit_init(struct ps_admit *a, uint64_t ids, uint64_t salt)
{
	uint64_t nb = 1;

	memset(a, 0, sizeof(*a));
	while (nb * BUCKET < ids)
		nb *= 2;
	a->slots = calloc(nb * BUCKET, sizeof(*a->slots));
	if (!a->slots)
		return -ENOMEM;
	a->nbuckets = nb;
	a->salt = salt;
	return 0;
}

void ps_admit_free(struct ps_admit *a)
{
	free(a->slots);
	memset(a, 0, sizeof(*a));
}

/* id's fingerprint (never 0) and its two buckets. */
static uint32_t locate(const struct ps_admit *a, uint64_t id, uint64_t *b1, uint64_t *b2)
{
	uint64_t h = mix64(id ^ a->salt);
	uint32_t fp = (uint32_t)(h >> 40);

	if (!fp)
		fp = 1;
	*b1 = h & (a->nbuckets - 1);
	*b2 = (*b1 ^ mix64(fp)) & (a->nbuckets - 1);
	return fp;
}

static uint32_t *find(const struct ps_admit *a, uint64_t b, uint32_t fp)
{
	uint32_t *s = a->slots + b * BUCKET;

	for (int i = 0; i < BUCKET; i++)
		if (s[i] && s[i] >> 8 == fp)
			return &s[i];
	return NULL;
}

static uint32_t *empty(const struct ps_admit *a, uint64_t b)
{
	uint32_t *s = a->slots + b * BUCKET;

	for (int i = 0; i < BUCKET; i++)
		if (!s[i])
			return &s[i];
	return NULL;
}

/* Halves every count; counts of 1 free their slot. */
static void decay(struct ps_admit *a)
{
	uint64_t n = a->nbuckets * BUCKET;

	for (uint64_t i = 0; i < n; i++) {
		uint32_t c = a->slots[i] & 0xff;
		if (!a->slots[i])
			continue;
		c >>= 1;
		if (c)
			a->slots[i] = (a->slots[i] & ~0xffu) | c;
		else {
			a->slots[i] = 0;
			a->used--;
		}
	}
	a->decays++;
}

int ps_admit_sight(struct ps_admit *a, uint64_t id, int k, int need)
{
	uint64_t b1, b2;
	uint32_t fp = locate(a, id, &b1, &b2), *s, c;

	a->lookups++;
	s = find(a, b1, fp);
	if (!s)
		s = find(a, b2, fp);
	if (s) {
		a->hits++;
		c = (*s & 0xff) + (uint32_t)k;
		if (c >= (uint32_t)need) {
			*s = 0;
			a->used--;
			return 1;
		}
		*s = fp << 8 | c;
		return 0;
	}
	if ((uint32_t)k >= (uint32_t)need)
		return 1;
	while (!(s = empty(a, b1)) && !(s = empty(a, b2)))
		decay(a);
	*s = fp << 8 | (uint32_t)k;
	a->used++;
	return 0;
}

int ps_admit_count(const struct ps_admit *a, uint64_t id)
{
	uint64_t b1, b2;
	uint32_t fp, *s;

	if (!a->slots)
		return 0;
	fp = locate(a, id, &b1, &b2);
	s = find(a, b1, fp);
	if (!s)
		s = find(a, b2, fp);
	return s ? (int)(*s & 0xff) : 0;
}

uint64_t ps_admit_bytes(const struct ps_admit *a)
{
	return a->nbuckets * BUCKET * sizeof(uint32_t);
}

/* The other bucket an entry with fingerprint fp in bucket b may sit in:
 * the partner of b1 is b2 and of b2 is b1 (locate's xor). */
static uint64_t partner(const struct ps_admit *a, uint64_t b, uint32_t fp)
{
	return (b ^ mix64(fp)) & (a->nbuckets - 1);
}

int ps_admit_merge(struct ps_admit *a, const struct ps_admit *src)
{
	if (!a->slots || !src->slots)
		return 0;
	if (src->nbuckets != a->nbuckets || src->salt != a->salt)
		return -EINVAL;
	for (uint64_t b = 0; b < src->nbuckets; b++) {
		for (int i = 0; i < BUCKET; i++) {
			uint32_t e = src->slots[b * BUCKET + i], fp = e >> 8, c = e & 0xff, *s;
			uint64_t p;

			if (!e)
				continue;
			p = partner(a, b, fp);
			s = find(a, b, fp);
			if (!s)
				s = find(a, p, fp);
			if (s) {
				/* another id of the same fingerprint and buckets: they
				 * share a count, as at run time (admitted early) */
				c += *s & 0xff;
				*s = fp << 8 | (c > 255 ? 255 : c);
				continue;
			}
			while (c && !(s = empty(a, b)) && !(s = empty(a, p))) {
				decay(a);
				c >>= 1;
			}
			if (c) {
				*s = fp << 8 | c;
				a->used++;
			}
		}
	}
	return 0;
}
