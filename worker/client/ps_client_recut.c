/* ps_client_recut.c - a waiting push cut again for a new shard map from
 * the bytes it was encoded into (docs/elastic.md, "Re-sharding while the
 * workers run"; the caller is recut in ps_client_follow.c).
 *
 * A push refused at a re-shard's stop was encoded once already. With an
 * error-feedback codec (topk, sign, q8 with compression.error_feedback)
 * that encoding moved the tensor's residual on: what a slice's message
 * left out is kept for the next push. Encoding the caller's tensors again
 * would add the residual a second time. Slices are the same in every map
 * (slicing does not depend on the shard count), and a slice's encoding
 * depends only on its values, its residual, the clock and the slice's id,
 * so the bytes each slice was encoded into are regrouped per new shard
 * unchanged: the new shards get exactly what the old ones would have, and
 * a sync clock's rank-ordered sum is the same bit for bit. The learning
 * rates the push gave its optimizer groups go with it as they were. The
 * new parts are sent without the LZ4 stage (a transport stage the shard
 * takes either way); every push is cut again this way, whatever its
 * codecs, raw slices copied like encoded ones.
 */
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "ps_client_int.h"
#include "ps_err.h"

struct piece {
	const uint8_t *bytes; /* NULL: not in any old part */
	uint64_t len;
	uint32_t codec;
};

/* Fills by[slice id] with the pieces of old part p (its Push in m); an
 * LZ4 payload is expanded into *buf. 0 or a code. */
static int collect(const struct part *p, const Ps__Push *m, struct piece *by, uint32_t nslices,
		   uint8_t **buf)
{
	char err[200];

	if (p->frame_flags & PS_FRAME_F_LZ4) {
		if (p->niov != 1 || !m->raw_length || m->raw_length > UINT32_MAX)
			return PS_EPROTO;
		if (!(*buf = malloc((size_t)m->raw_length)))
			return -ENOMEM;
		if (ps_lz4_unpack(p->iov[0].base, p->iov[0].len, *buf, (size_t)m->raw_length, err,
				  sizeof(err)))
			return PS_EPROTO;
	} else if ((size_t)p->niov != m->n_slices) {
		return PS_EPROTO;
	}
	for (size_t i = 0; i < m->n_slices; i++) {
		const Ps__SliceRef *ref = m->slices[i];
		if (ref->slice >= nslices)
			return PS_EMAP;
		if (*buf) {
			if (ref->offset > m->raw_length || ref->length > m->raw_length - ref->offset)
				return PS_EPROTO;
			by[ref->slice].bytes = *buf + ref->offset;
		} else {
			if (ref->length > p->iov[i].len)
				return PS_EPROTO;
			by[ref->slice].bytes = p->iov[i].base;
		}
		by[ref->slice].len = ref->length;
		by[ref->slice].codec = ref->codec;
	}
	return 0;
}

/* Part p for shard k of the new map: the pieces of r's slices that shard
 * owns, in tensor then slice order, copied into p->enc. */
static int build_part(struct ps_client *c, struct req *r, struct part *p, int k,
		      const int *tidx, const struct piece *by, const Ps__Push *lr_from)
{
	const struct ps_shardmap *map = &c->map;
	uint32_t cnt = 0;
	size_t cap = 0, used = 0;
	uint64_t off = 0;
	Ps__SliceRef *refs = NULL, **ptrs = NULL;
	Ps__Push m = PS__PUSH__INIT;
	int rc = -ENOMEM;

	for (int i = 0; i < r->n; i++)
		for (uint32_t s = map->tensor_first[tidx[i]]; s < map->tensor_first[tidx[i] + 1]; s++)
			if (map->slices[s].shard == k) {
				if (!by[s].bytes)
					return PS_EMAP;
				cnt++;
				cap += ((size_t)by[s].len + 7) & ~(size_t)7;
			}
	if (!cnt && !r->end_clock)
		return 0;
	p->iov = malloc(sizeof(*p->iov) * (cnt ? cnt : 1));
	refs = calloc(cnt ? cnt : 1, sizeof(*refs));
	ptrs = calloc(cnt ? cnt : 1, sizeof(*ptrs));
	if (!p->iov || !refs || !ptrs || (cap && !(p->enc = malloc(cap))))
		goto out_free;
	for (int i = 0; i < r->n; i++)
		for (uint32_t s = map->tensor_first[tidx[i]]; s < map->tensor_first[tidx[i] + 1]; s++) {
			Ps__SliceRef *ref = &refs[p->niov];
			if (map->slices[s].shard != k)
				continue;
			ps__slice_ref__init(ref);
			ref->slice = s;
			ref->offset = off;
			ref->codec = by[s].codec;
			ref->length = by[s].len;
			memcpy(p->enc + used, by[s].bytes, (size_t)by[s].len);
			/* padded to 4 bytes as when built: the next offset stays aligned */
			memset(p->enc + used + by[s].len, 0, (size_t)(-by[s].len & 3));
			p->iov[p->niov].base = p->enc + used;
			p->iov[p->niov].len = (ref->length + 3) & ~(uint64_t)3;
			ptrs[p->niov++] = ref;
			off += (ref->length + 3) & ~(uint64_t)3;
			used += ((size_t)by[s].len + 7) & ~(size_t)7;
		}
	m.req_id = (uint64_t)r->id;
	m.seq = (uint64_t)r->id;
	m.clock = r->clock;
	m.end_clock = r->end_clock;
	m.leave = (r->push_flags & PS_PUSH_LEAVE) != 0;
	m.n_slices = (size_t)p->niov;
	m.slices = ptrs;
	if (lr_from) {
		m.n_group_lr = lr_from->n_group_lr;
		m.group_lr = lr_from->group_lr;
	}
	rc = ps__client_pack_part(p, &m.base) ? -ENOMEM : 0;
out_free:
	free(refs);
	free(ptrs);
	return rc;
}

int ps__client_push_recut(struct ps_client *c, struct req *r, const struct part *old, int nold)
{
	uint32_t ns = c->map.nslices;
	struct piece *by = calloc(ns ? ns : 1, sizeof(*by));
	Ps__Push **msgs = calloc((size_t)(nold > 0 ? nold : 1), sizeof(*msgs));
	uint8_t **bufs = calloc((size_t)(nold > 0 ? nold : 1), sizeof(*bufs));
	int *tidx = malloc(sizeof(int) * (size_t)(r->n > 0 ? r->n : 1));
	const Ps__Push *lr_from = NULL;
	int rc = -ENOMEM;

	if (!by || !msgs || !bufs || !tidx)
		goto out_free;
	for (int i = 0; i < r->n; i++)
		if ((tidx[i] = r->pt[i].name ? ps_config_find_tensor(c->cfg, r->pt[i].name) : -1) < 0) {
			rc = PS_ENOTENSOR;
			goto out_free;
		}
	for (int k = 0; k < nold; k++) {
		if (!old[k].meta)
			continue;
		msgs[k] = ps__push__unpack(NULL, old[k].meta_len, old[k].meta);
		if (!msgs[k]) {
			rc = PS_EPROTO;
			goto out_free;
		}
		if (msgs[k]->n_group_lr && !lr_from)
			lr_from = msgs[k];
		rc = collect(&old[k], msgs[k], by, ns, &bufs[k]);
		if (rc)
			goto out_free;
	}
	for (int k = 0; k < c->cfg->nshards; k++) {
		rc = build_part(c, r, &r->parts[k], k, tidx, by, lr_from);
		if (rc)
			goto out_free;
	}
	rc = 0;
out_free:
	for (int k = 0; msgs && bufs && k < nold; k++) {
		if (msgs[k])
			ps__push__free_unpacked(msgs[k], NULL);
		free(bufs[k]);
	}
	free(msgs);
	free(bufs);
	free(by);
	free(tidx);
	return rc;
}
