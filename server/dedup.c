/* dedup.c - the window of push numbers a shard has handled (dedup.h). */
#include <string.h>
#include "dedup.h"

#define W PS_DEDUP_WINDOW

void ps_dedup_incarnation(struct ps_dedup *d, uint64_t incarnation)
{
	if (d->incarnation == incarnation)
		return;
	memset(d, 0, sizeof(*d));
	d->incarnation = incarnation;
}

static int bit(const struct ps_dedup *d, uint64_t seq)
{
	return (int)(d->bits[(seq % W) / 64] >> (seq % 64)) & 1;
}

enum ps_dedup_verdict ps_dedup_check(const struct ps_dedup *d, uint64_t seq, int *code)
{
	*code = 0;
	if (seq > d->max)
		return PS_DEDUP_NEW;
	if (d->max - seq >= W)
		return PS_DEDUP_TOO_OLD;
	if (!bit(d, seq))
		return PS_DEDUP_NEW;
	for (unsigned i = 0; i < PS_DEDUP_ERRS && i < d->nerr; i++)
		if (d->errs[i].seq == seq)
			*code = d->errs[i].code;
	return PS_DEDUP_SEEN;
}

void ps_dedup_mark(struct ps_dedup *d, uint64_t seq, int code)
{
	if (!seq)
		return;
	if (seq > d->max) {
		/* slide the window: clear the bits of the numbers it now covers */
		uint64_t from = d->max + 1;
		if (seq - d->max >= W)
			memset(d->bits, 0, sizeof(d->bits));
		else
			for (uint64_t s = from; s <= seq; s++)
				d->bits[(s % W) / 64] &= ~(1ull << (s % 64));
		d->max = seq;
	} else if (d->max - seq >= W) {
		return;
	}
	d->bits[(seq % W) / 64] |= 1ull << (seq % 64);
	if (code) {
		d->errs[d->nerr % PS_DEDUP_ERRS].seq = seq;
		d->errs[d->nerr % PS_DEDUP_ERRS].code = code;
		d->nerr++;
	}
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

uint64_t ps_dedup_digest(const struct ps_dedup *d)
{
	uint64_t h = 0xcbf29ce484222325ull;

	h = fnv(h, &d->incarnation, sizeof(d->incarnation));
	h = fnv(h, &d->max, sizeof(d->max));
	return fnv(h, d->bits, sizeof(d->bits));
}
