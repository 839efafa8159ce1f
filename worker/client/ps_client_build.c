/* ps_client_build.c - building a request (calling thread; nothing sent).
 *
 * The caller's tensors are checked against the config and cut into slices
 * by the shard map, grouped per shard: one part per shard, its metadata
 * (Push or Pull) packed and its payload pieces pointing into the caller's
 * tensors, or for codec'd slices into the part's own encoded buffer, which
 * the optional LZ4 stage then packs. Ids are reserved here, so a request is
 * final before it is queued.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "ps_client_int.h"
#include "ps_err.h"

/* Packs msg into part p (of the shard it goes to). */
int ps__client_pack_part(struct part *p, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);

	p->meta = malloc(len ? len : 1);
	if (!p->meta)
		return -ENOMEM;
	p->meta_len = (uint32_t)protobuf_c_message_pack(msg, p->meta);
	p->waiting = 1;
	return 0;
}

/* Checks the caller's tensors against the config; fills tidx. */
static int resolve_tensors(struct ps_client *c, const struct ps_tensor *t, int n, int *tidx)
{
	for (int i = 0; i < n; i++) {
		int ti = t[i].name ? ps_config_find_tensor(c->cfg, t[i].name) : PS_ENOTENSOR;
		if (ti < 0) {
			ps__client_set_err(c, "unknown tensor '%s'", t[i].name ? t[i].name : "(null)");
			return PS_ENOTENSOR;
		}
		if (t[i].count != c->cfg->tensors[ti].count || !t[i].data) {
			ps__client_set_err(c, "tensor '%s' has %" PRId64 " elements, the config says %" PRId64,
					   t[i].name, t[i].count, c->cfg->tensors[ti].count);
			return PS_ESHAPE;
		}
		tidx[i] = ti;
	}
	return 0;
}

/* Slices per shard of the tensors tidx[0..n). */
static void count_slices(struct ps_client *c, const int *tidx, int n, uint32_t *per_shard)
{
	memset(per_shard, 0, sizeof(*per_shard) * (size_t)c->cfg->nshards);
	for (int i = 0; i < n; i++)
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++)
			per_shard[c->map.slices[s].shard]++;
}

/* Fills part p (shard k) with this shard's slices of t, in tensor then
 * slice order: raw slices point at the caller's data (no copy), encoded ones
 * at p->enc. refs/ptrs receive the slice refs; *off the payload length. */
static int encode_part(struct ps_client *c, struct part *p, int k, const struct ps_tensor *t,
		       const int *tidx, int n, uint64_t clock, Ps__SliceRef *refs,
		       Ps__SliceRef **ptrs, uint64_t *off)
{
	const struct ps_config *cfg = c->cfg;
	size_t cap = 0, used = 0;

	for (int i = 0; i < n; i++) {
		const struct ps_tensor_cfg *tc = &cfg->tensors[tidx[i]];
		const struct ps_codec_ops *co = ps_codec_get(tc->codec);
		struct ps_codec_params prm = { tc->ratio, cfg->seed };

		if (tc->codec == PS_CODEC_NONE)
			continue;
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++)
			if (c->map.slices[s].shard == k)
				cap += (co->max_bytes((size_t)c->map.slices[s].count, &prm) + 7) & ~(size_t)7;
	}
	if (cap && !(p->enc = malloc(cap)))
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		const struct ps_tensor_cfg *tc = &cfg->tensors[tidx[i]];
		const struct ps_codec_ops *co = ps_codec_get(tc->codec);
		struct ps_codec_params prm = { tc->ratio, cfg->seed };
		float *resid = NULL;

		if (tc->codec != PS_CODEC_NONE && co->lossy_ef && cfg->compress.error_feedback) {
			if (!c->resid[tidx[i]] &&
			    !(c->resid[tidx[i]] = calloc((size_t)tc->count, sizeof(float))))
				return -ENOMEM;
			resid = c->resid[tidx[i]];
		}
		for (uint32_t s = c->map.tensor_first[tidx[i]]; s < c->map.tensor_first[tidx[i] + 1]; s++) {
			const struct ps_slice *sl = &c->map.slices[s];
			Ps__SliceRef *ref = &refs[p->niov];
			size_t raw = (size_t)sl->count * sizeof(float);
			if (sl->shard != k)
				continue;
			ps__slice_ref__init(ref);
			ref->slice = sl->id;
			ref->offset = *off;
			ref->codec = (uint32_t)tc->codec;
			if (tc->codec == PS_CODEC_NONE) {
				ref->length = raw;
				p->iov[p->niov].base = t[i].data + sl->offset;
			} else {
				size_t room = (co->max_bytes((size_t)sl->count, &prm) + 7) & ~(size_t)7;
				ssize_t e = co->encode(t[i].data + sl->offset,
						       resid ? resid + sl->offset : NULL, (size_t)sl->count,
						       &prm, clock * 1000003u + sl->id, p->enc + used, room);
				if (e < 0)
					return (int)e;
				ref->length = (uint64_t)e;
				p->iov[p->niov].base = p->enc + used;
				/* padded to 4 bytes so the next slice's offset stays aligned */
				memset(p->enc + used + e, 0, (size_t)(-e & 3));
				used += ((size_t)e + 7) & ~(size_t)7;
			}
			p->iov[p->niov].len = (ref->length + 3) & ~(uint64_t)3;
			ptrs[p->niov] = ref;
			*off += p->iov[p->niov].len;
			p->niov++;
			c->push_raw += raw;
		}
	}
	return 0;
}

/* The LZ4 stage over part p's whole payload (len bytes): on success the
 * part sends one packed piece, flagged PS_FRAME_F_LZ4, with the expanded
 * length in *raw_length; kept as it is when LZ4 would not shrink it. auto
 * tries only payloads of topk, sign and q8 slices of at least 1 KiB (their
 * indices and bit patterns compress; float32 and fp16 values rarely do). */
static int lz4_part(struct ps_client *c, struct part *p, uint64_t len, uint64_t *raw_length,
		    const Ps__SliceRef *const *refs)
{
	uint8_t *src, *dst, *tmp = NULL;
	size_t packed, bound;
	int try = c->cfg->compress.lz4 == PS_LZ4_ON ? len >= 64 : 0;

	if (c->cfg->compress.lz4 == PS_LZ4_AUTO && len >= 1024)
		for (int i = 0; i < p->niov && !try; i++)
			try = refs[i]->codec == PS_CODEC_TOPK || refs[i]->codec == PS_CODEC_SIGN ||
			      refs[i]->codec == PS_CODEC_Q8;
	if (!try || len > UINT32_MAX / 2)
		return 0;
	if (p->niov == 1) {
		src = (uint8_t *)p->iov[0].base;
	} else {
		size_t at = 0;
		if (!(src = tmp = malloc(len)))
			return -ENOMEM;
		for (int i = 0; i < p->niov; i++) {
			memcpy(tmp + at, p->iov[i].base, p->iov[i].len);
			at += p->iov[i].len;
		}
	}
	bound = ps_lz4_bound(len);
	dst = malloc(bound);
	if (!dst) {
		free(tmp);
		return -ENOMEM;
	}
	packed = ps_lz4_pack(src, len, dst, bound);
	free(tmp);
	if (!packed) {
		free(dst);
		return 0;
	}
	free(p->enc);
	p->enc = dst;
	p->iov[0].base = dst;
	p->iov[0].len = packed;
	p->niov = 1;
	p->frame_flags |= PS_FRAME_F_LZ4;
	*raw_length = len;
	return 0;
}

/* Ids are reserved before packing so the metadata is final when queued. */
int64_t ps__client_reserve_id(struct ps_client *c)
{
	int64_t id;

	pthread_mutex_lock(&c->mu);
	id = ++c->next_id;
	pthread_mutex_unlock(&c->mu);
	return id;
}

/* Builds a push request (every frame packed, nothing sent): *out, or a
 * negative code. */
int ps__client_build_push(struct ps_client *c, uint64_t clock, const struct ps_tensor *t, int n,
			  unsigned flags, struct req **out)
{
	struct req *r = ps__client_req_new(c, REQ_PUSH);
	int ngroups = c->cfg->ngroups, rc;
	float lrs[PS_MAX_GROUPS];

	if (!r)
		return -ENOMEM;
	if (ngroups) {
		/* the groups' rates now (another thread may set them) */
		pthread_mutex_lock(&c->mu);
		memcpy(lrs, c->group_lr, sizeof(float) * (size_t)ngroups);
		pthread_mutex_unlock(&c->mu);
	}
	r->clock = clock;
	r->end_clock = (flags & PS_PUSH_END_CLOCK) != 0;
	r->pt = t;
	r->n = n;
	r->push_flags = flags;
	r->id = ps__client_reserve_id(c);
	rc = ps__client_push_parts(c, r, lrs);
	if (rc) {
		ps__client_req_free(c, r);
		return rc;
	}
	if ((flags & PS_PUSH_END_CLOCK) && c->rank >= 0) {
		/* only a worker has a clock (a reader's push is refused) */
		pthread_mutex_lock(&c->mu);
		if (clock + 1 > c->clock)
			c->clock = clock + 1;
		pthread_mutex_unlock(&c->mu);
	}
	*out = r;
	return 0;
}

int ps__client_push_parts(struct ps_client *c, struct req *r, const float *lrs)
{
	const struct ps_tensor *t = r->pt;
	int n = r->n, nsh = c->cfg->nshards, rc = -ENOMEM;
	int *tidx = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	uint32_t *cnt = malloc(sizeof(uint32_t) * (size_t)nsh);
	Ps__SliceRef *refs = NULL, **ptrs = NULL;
	uint32_t total = 0, base = 0;
	unsigned flags = r->push_flags;

	if (!tidx || !cnt)
		goto out_free;
	rc = resolve_tensors(c, t, n, tidx);
	if (rc)
		goto out_free;
	rc = -ENOMEM;
	count_slices(c, tidx, n, cnt);
	for (int k = 0; k < nsh; k++)
		total += cnt[k];
	refs = calloc(total ? total : 1, sizeof(*refs));
	ptrs = calloc(total ? total : 1, sizeof(*ptrs));
	if (!refs || !ptrs)
		goto out_free;
	for (int k = 0; k < nsh; k++) {
		struct part *p = &r->parts[k];
		Ps__Push m = PS__PUSH__INIT;
		uint64_t off = 0;
		if (!cnt[k] && !(flags & PS_PUSH_END_CLOCK))
			continue;
		p->iov = malloc(sizeof(*p->iov) * (cnt[k] ? cnt[k] : 1));
		if (!p->iov)
			goto out_free;
		rc = encode_part(c, p, k, t, tidx, n, r->clock, refs + base, ptrs + base, &off);
		if (rc)
			goto out_free;
		rc = -ENOMEM;
		m.req_id = (uint64_t)r->id;
		m.seq = (uint64_t)r->id; /* increasing: the shard's duplicate check */
		m.clock = r->clock;
		m.end_clock = (flags & PS_PUSH_END_CLOCK) != 0;
		m.leave = (flags & PS_PUSH_LEAVE) != 0;
		m.n_slices = (size_t)p->niov;
		m.slices = ptrs + base;
		m.n_group_lr = (size_t)c->cfg->ngroups;
		m.group_lr = (float *)lrs;
		base += (uint32_t)p->niov;
		if (off && c->cfg->compress.lz4 != PS_LZ4_OFF) {
			rc = lz4_part(c, p, off, &m.raw_length,
				      (const Ps__SliceRef *const *)m.slices);
			if (rc)
				goto out_free;
			rc = -ENOMEM;
		}
		if (ps__client_pack_part(p, &m.base))
			goto out_free;
		for (int i = 0; i < p->niov; i++)
			c->push_wire += p->iov[i].len;
	}
	rc = 0;
out_free:
	free(refs);
	free(ptrs);
	free(tidx);
	free(cnt);
	return rc;
}

/* Builds a pull request (see ps__client_build_push). The shard is told the worker
 * is at clock after_push + 1 when that is ahead of c->clock (the pull of
 * ps_client_pushpull is built before the push that ends after_push);
 * UINT64_MAX = c->clock as it is. */
int ps__client_build_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t, int n,
			  uint64_t after_push, struct req **out)
{
	struct req *r = ps__client_req_new(c, REQ_PULL);
	uint64_t clock;
	int rc = -ENOMEM;

	if (!r)
		return -ENOMEM;
	r->tidx = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
	if (!r->tidx)
		goto err_free;
	rc = resolve_tensors(c, t, n, r->tidx);
	if (rc)
		goto err_free;
	r->t = t;
	r->n = n;
	pthread_mutex_lock(&c->mu);
	clock = c->clock;
	pthread_mutex_unlock(&c->mu);
	if (after_push != UINT64_MAX && after_push + 1 > clock)
		clock = after_push + 1;
	r->min_version = min_version;
	r->pull_clock = clock;
	r->id = ps__client_reserve_id(c);
	rc = ps__client_pull_parts(c, r);
	if (rc)
		goto err_free;
	*out = r;
	return 0;

err_free:
	ps__client_req_free(c, r);
	return rc;
}

int ps__client_pull_parts(struct ps_client *c, struct req *r)
{
	int nsh = c->cfg->nshards, n = r->n;
	uint32_t *cnt = malloc(sizeof(uint32_t) * (size_t)nsh);
	uint32_t *ids = NULL;
	int rc = -ENOMEM;

	if (!cnt)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		r->t[i].version = UINT64_MAX;
	count_slices(c, r->tidx, n, cnt);
	for (int k = 0; k < nsh; k++) {
		Ps__Pull m = PS__PULL__INIT;
		uint32_t j = 0;
		if (!cnt[k])
			continue;
		free(ids);
		ids = malloc(sizeof(*ids) * cnt[k]);
		if (!ids)
			goto out_free;
		for (int i = 0; i < n; i++)
			for (uint32_t s = c->map.tensor_first[r->tidx[i]];
			     s < c->map.tensor_first[r->tidx[i] + 1]; s++)
				if (c->map.slices[s].shard == k)
					ids[j++] = s;
		m.req_id = (uint64_t)r->id;
		m.min_version = r->min_version;
		m.codec = (uint32_t)c->cfg->compress.pull;
		m.clock = r->pull_clock;
		m.n_slices = j;
		m.slices = ids;
		if (ps__client_pack_part(&r->parts[k], &m.base))
			goto out_free;
	}
	rc = 0;
out_free:
	free(ids);
	free(cnt);
	return rc;
}
