/* declare.c - tensors declared at run time (a config without a model).
 *
 * A shard whose config names no dense model (cfg->declare) starts with no
 * tensors. The first worker declaration it accepts, from rank 0, names the
 * model's tensors (names and shapes in the model's order) and carries the
 * initial values of the slices this shard owns: the shard then builds its
 * own copy of the config with those tensors, the shard map and the store.
 * Later declarations (other ranks, restarted workers) must name the same
 * list: they are answered with an ack, and a differing one with an Error
 * naming the first difference and both sides' lists. A declaration from
 * another rank before rank 0's is answered -EAGAIN (the client asks
 * again). A checkpoint carries the declared list (checkpoint.c), so a
 * restarted shard has its tensors back before any worker declares.
 *
 * With cluster.replicas: 1 the primary forwards a declaration it adopts
 * to its backup in its next batch, and a joining backup gets the declared
 * list first in its state transfer (replica_decl.c); declarations are
 * acknowledged once the backup confirmed them, as pushes are.
 *
 * A declaration may carry optimizer groups (ps_client_declare_groups): the
 * update rule of each group and each tensor's group are then part of the
 * declaration, compared like the shapes (every setting but the learning
 * rate, which pushes carry).
 *
 * Everything a peer sends is bounded before anything is allocated: the
 * tensor count (PS_MAX_TENSORS), dims per tensor (PS_MAX_DIMS), each dim
 * and every tensor's element count (PS_DECL_MAX_COUNT), the groups (1..
 * PS_MAX_GROUPS, known kinds, settings in torch's ranges, every tensor's
 * group in range), the slices of the map, and the payload, which must be
 * exactly this shard's share.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "msg.h"
#include "optim_group.h"
#include "ps_err.h"
#include "ps_log.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

/* Largest element count of one declared tensor, and of all together
 * (2^36 floats: 256 GiB). */
#define PS_DECL_MAX_COUNT (INT64_C(1) << 36)

static int name_cmp(const void *a, const void *b)
{
	const struct ps_tensor_cfg *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

/* Checks and converts m into list (n entries). 0, or PS_EPROTO /
 * PS_ETOOBIG with the reason in why. */
static int parse_list(const Ps__Declare *m, struct ps_tensor_cfg *list, char *why, size_t wl)
{
	size_t d = 0;
	int64_t total = 0;
	const struct ps_tensor_cfg **sorted;

	for (size_t i = 0; i < m->n_names; i++) {
		struct ps_tensor_cfg *t = &list[i];
		const char *nm = m->names[i];
		size_t len = strlen(nm);

		if (!len || len >= PS_NAME_MAX) {
			snprintf(why, wl, "tensor %zu: name of %zu bytes, expected 1..%d", i, len,
				 PS_NAME_MAX - 1);
			return PS_EPROTO;
		}
		if (m->ndims[i] > PS_MAX_DIMS) {
			snprintf(why, wl, "tensor %zu ('%s'): %u dims, at most %d", i, nm, m->ndims[i],
				 PS_MAX_DIMS);
			return PS_EPROTO;
		}
		if (m->ndims[i] > m->n_dims - d) {
			snprintf(why, wl, "tensor %zu ('%s'): %u dims, only %zu left in the list", i, nm,
				 m->ndims[i], m->n_dims - d);
			return PS_EPROTO;
		}
		memcpy(t->name, nm, len + 1);
		t->ndims = (int)m->ndims[i];
		t->count = 1;
		for (int j = 0; j < t->ndims; j++, d++) {
			int64_t v = m->dims[d];
			if (v < 1 || v > PS_DECL_MAX_COUNT || t->count > PS_DECL_MAX_COUNT / v) {
				snprintf(why, wl, "tensor %zu ('%s'): dim %d is %" PRId64 ", expected >= 1 "
					 "and at most %" PRId64 " elements in a tensor", i, nm, j, v,
					 PS_DECL_MAX_COUNT);
				return PS_ETOOBIG;
			}
			t->dims[j] = v;
			t->count *= v;
		}
		total += t->count;
		if (total > PS_DECL_MAX_COUNT) {
			snprintf(why, wl, "more than %" PRId64 " elements in all", PS_DECL_MAX_COUNT);
			return PS_ETOOBIG;
		}
		t->init = PS_INIT_ZEROS;
	}
	if (d != m->n_dims) {
		snprintf(why, wl, "%zu dims given, the tensors use %zu", m->n_dims, d);
		return PS_EPROTO;
	}
	/* duplicate names: sorted, neighbours compared */
	sorted = malloc(sizeof(*sorted) * m->n_names);
	if (!sorted) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_names; i++)
		sorted[i] = &list[i];
	qsort(sorted, m->n_names, sizeof(*sorted), name_cmp);
	for (size_t i = 1; i < m->n_names; i++)
		if (!strcmp(sorted[i]->name, sorted[i - 1]->name)) {
			snprintf(why, wl, "tensor '%s' declared twice", sorted[i]->name);
			free(sorted);
			return PS_EPROTO;
		}
	free(sorted);
	return 0;
}

/* Checks and converts m's optimizer groups into groups (*ngroups of them,
 * 0 when m has none) and every tensor's group into list[i].group. 0, or
 * PS_EPROTO / PS_ECONFIG with the reason in why. */
static int parse_groups(const struct ps_server *s, const Ps__Declare *m,
			struct ps_tensor_cfg *list, struct ps_optim_cfg *groups, int *ngroups,
			char *why, size_t wl)
{
	int rc;

	*ngroups = 0;
	if (!m->n_groups && !m->n_group_of)
		return 0;
	if (m->n_groups < 1 || m->n_groups > PS_MAX_GROUPS || m->n_group_of != m->n_names) {
		snprintf(why, wl, "%zu optimizer groups and %zu group indices for %zu tensors: "
			 "expected 1..%d groups and one index per tensor", m->n_groups,
			 m->n_group_of, m->n_names, PS_MAX_GROUPS);
		return PS_EPROTO;
	}
	for (size_t g = 0; g < m->n_groups; g++) {
		rc = ps_optim_group_from_msg((int)g, m->groups[g],
					     s->cfg->consistency == PS_ASYNC, &groups[g], why, wl);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_names; i++) {
		if (m->group_of[i] >= m->n_groups) {
			snprintf(why, wl, "tensor %zu ('%s'): optimizer group %u, only %zu groups", i,
				 list[i].name, m->group_of[i], m->n_groups);
			return PS_EPROTO;
		}
		list[i].group = (int)m->group_of[i];
	}
	*ngroups = (int)m->n_groups;
	return 0;
}

/* 0 when groups (ngroups) and list's group indices (n) equal the shard's;
 * else PS_ECONFIG naming the tensor or group and the differing field with
 * both values in why. Called once the shapes agree. */
static int compare_groups(const struct ps_server *s, const struct ps_tensor_cfg *list, int n,
			  const struct ps_optim_cfg *groups, int ngroups, char *why, size_t wl)
{
	const struct ps_config *cfg = s->cfg;
	char d[300];

	if (ngroups != cfg->ngroups) {
		snprintf(why, wl, "the shard's tensors have %d optimizer groups, this declaration %d "
			 "(0: the config's optimizer section)", cfg->ngroups, ngroups);
		return PS_ECONFIG;
	}
	for (int g = 0; g < ngroups; g++)
		if (ps_optim_group_diff(g, &cfg->groups[g], &groups[g], d, sizeof(d))) {
			snprintf(why, wl, "declaration differs from the shard's: %s", d);
			return PS_ECONFIG;
		}
	for (int i = 0; ngroups && i < n; i++)
		if (list[i].group != cfg->tensors[i].group) {
			snprintf(why, wl, "declaration differs from the shard's: tensor #%d ('%s') is in "
				 "optimizer group %d on the shard, %d in this declaration", i,
				 list[i].name, cfg->tensors[i].group, list[i].group);
			return PS_ECONFIG;
		}
	return 0;
}

/* "name[d0,d1]" of t into buf. */
static void shape_text(const struct ps_tensor_cfg *t, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "%s[", t->name);

	for (int j = 0; j < t->ndims && n < len; j++)
		n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, j ? "," : "", t->dims[j]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

/* The first few entries of a list from i on, for a message. */
static void list_text(const struct ps_tensor_cfg *t, int n, int from, char *buf, size_t len)
{
	size_t k = 0;
	char one[PS_NAME_MAX + 100];

	buf[0] = 0;
	from = from > 1 ? from - 1 : 0;
	for (int i = from; i < n && i < from + 3 && k < len; i++) {
		shape_text(&t[i], one, sizeof(one));
		k += (size_t)snprintf(buf + k, len - k, "%s#%d %s", i > from ? ", " : "", i, one);
	}
	if (k < len)
		snprintf(buf + k, len - k, "%s (%d tensors)", from + 3 < n ? ", ..." : "", n);
}

/* 0 when list (n) equals the shard's tensors; else PS_ECONFIG with the
 * first difference and both lists around it in why. */
static int compare(const struct ps_server *s, const struct ps_tensor_cfg *list, int n, char *why,
		   size_t wl)
{
	const struct ps_config *cfg = s->cfg;
	char a[PS_NAME_MAX + 100] = "(none)", b[PS_NAME_MAX + 100] = "(none)";
	char la[200], lb[200];
	int i;

	for (i = 0; i < n && i < cfg->ntensors; i++) {
		const struct ps_tensor_cfg *x = &cfg->tensors[i], *y = &list[i];
		if (strcmp(x->name, y->name) || x->ndims != y->ndims ||
		    memcmp(x->dims, y->dims, sizeof(x->dims[0]) * (size_t)x->ndims))
			break;
	}
	if (i == n && n == cfg->ntensors)
		return 0;
	if (i < cfg->ntensors)
		shape_text(&cfg->tensors[i], a, sizeof(a));
	if (i < n)
		shape_text(&list[i], b, sizeof(b));
	list_text(cfg->tensors, cfg->ntensors, i, la, sizeof(la));
	list_text(list, n, i, lb, sizeof(lb));
	snprintf(why, wl, "declaration differs from the shard's tensors at #%d: the shard has %s, "
		 "this worker declares %s (shard: %s; worker: %s)", i, a, b, la, lb);
	return PS_ECONFIG;
}

int ps__srv_declare_adopt(struct ps_server *s, const struct ps_tensor_cfg *list, int n,
			  const struct ps_optim_cfg *groups, int ngroups, const void *values,
			  uint64_t values_len, char *why, size_t wl)
{
	struct ps_config *cfg = malloc(sizeof(*cfg));
	struct ps_shardmap map;
	struct ps_store st;
	uint32_t *seen;
	uint64_t need = 0, pos = 0;
	int rc;

	if (!cfg) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	memcpy(cfg, s->cfg, sizeof(*cfg));
	memcpy(cfg->tensors, list, sizeof(*list) * (size_t)n);
	cfg->ntensors = n;
	cfg->ngroups = ngroups;
	if (ngroups)
		memcpy(cfg->groups, groups, sizeof(*groups) * (size_t)ngroups);
	/* every tensor's codec: compression.tensors by declared name, as the
	 * client does */
	rc = ps_config_declared_codecs(cfg, why, wl);
	if (rc)
		goto err_free_cfg;
	rc = ps_shardmap_init_placed(&map, cfg, s->map.placement);
	if (rc) {
		snprintf(why, wl, "cannot build the shard map: %s", ps_strerror(rc));
		goto err_free_cfg;
	}
	if (values) {
		need = map.shard_bytes[s->shard];
		if (values_len != need) {
			snprintf(why, wl, "%" PRIu64 " bytes of initial values, this shard owns %" PRIu64,
				 values_len, need);
			rc = PS_ESHAPE;
			goto err_free_map;
		}
		for (uint64_t i = 0; i < need / sizeof(float); i++) {
			float v;
			memcpy(&v, (const uint8_t *)values + i * sizeof(float), sizeof(v));
			if (!isfinite(v)) {
				snprintf(why, wl, "initial value %" PRIu64 " of this shard's share is not "
					 "finite", i);
				rc = PS_ENOFINITE;
				goto err_free_map;
			}
		}
	}
	rc = ps_store_init(&st, cfg, &map, s->shard);
	if (rc) {
		snprintf(why, wl, "cannot build the store: %s", ps_strerror(rc));
		goto err_free_map;
	}
	seen = calloc((size_t)(st.nslots ? st.nslots : 1), sizeof(*seen));
	if (!seen) {
		snprintf(why, wl, "out of memory");
		rc = -ENOMEM;
		goto err_free_store;
	}
	for (int k = 0; values && k < st.nslots; k++) {
		size_t b = (size_t)st.slots[k].slice->count * sizeof(float);
		memcpy(st.slots[k].w, (const uint8_t *)values + pos, b);
		pos += b;
	}
	/* install: the new store takes the old one's links to the shard */
	st.errors = s->store.errors;
	st.live = s->store.live;
	st.finished = s->store.finished;
	ps_store_free(&s->store);
	ps_shardmap_free(&s->map);
	free(s->seen);
	s->map = map;
	s->store = st;
	s->store.map = &s->map;
	s->seen = seen;
	s->seen_gen = 0;
	free(s->decl_cfg);
	s->decl_cfg = cfg;
	s->cfg = cfg;
	/* the embedding tables (declared ones among them) live on */
	ps__rows_rebind(s);
	/* replicated: the new store tells the primary's batches of its changes */
	if (s->repl)
		ps__repl_log_init_hooks(s);
	return 0;

err_free_store:
	ps_store_free(&st);
err_free_map:
	ps_shardmap_free(&map);
err_free_cfg:
	free(cfg);
	return rc;
}

int ps__srv_declare_msg(struct ps_server *s, int rank, const Ps__Declare *m, const void *values,
			uint64_t values_len, int *adopted, char *why, size_t wl)
{
	struct ps_tensor_cfg *list = NULL;
	struct ps_optim_cfg *groups = NULL;
	int rc, n = (int)m->n_names, ngroups = 0;

	*adopted = 0;
	if (!s->cfg->declare) {
		snprintf(why, wl, "this shard's config (%.200s) names its model; declared "
			 "tensors need a config without model.preset, .layers and .tensors",
			 s->cfg->path);
		return PS_ECONFIG;
	}
	if (m->n_names < 1 || m->n_names > PS_MAX_TENSORS || m->n_ndims != m->n_names ||
	    m->n_dims > (size_t)PS_MAX_TENSORS * PS_MAX_DIMS) {
		snprintf(why, wl, "declaration of %zu tensors (%zu shapes, %zu dims): "
			 "expected 1..%d tensors, one shape each", m->n_names, m->n_ndims, m->n_dims,
			 PS_MAX_TENSORS);
		return PS_ETOOBIG;
	}
	list = calloc((size_t)n, sizeof(*list));
	groups = calloc(PS_MAX_GROUPS, sizeof(*groups));
	if (!list || !groups) {
		rc = -ENOMEM;
		snprintf(why, wl, "out of memory");
		goto out;
	}
	rc = parse_list(m, list, why, wl);
	if (!rc)
		rc = parse_groups(s, m, list, groups, &ngroups, why, wl);
	if (rc)
		goto out;
	if (s->cfg->ntensors) {
		/* declared before (or restored from the checkpoint, or sent by
		 * the primary): the values of a re-declaring rank 0 are not used */
		rc = compare(s, list, n, why, wl);
		if (!rc)
			rc = compare_groups(s, list, n, groups, ngroups, why, wl);
	} else if (rank != 0 || !m->values) {
		rc = -EAGAIN;
		snprintf(why, wl, "no tensors declared yet: waiting for rank 0's declaration");
	} else {
		rc = ps__srv_declare_adopt(s, list, n, groups, ngroups, values, values_len, why,
					   wl);
		*adopted = !rc;
	}
out:
	free(list);
	free(groups);
	return rc;
}

/* One FNV-1a step over n bytes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
	return h;
}

uint64_t ps__srv_decl_digest(const struct ps_server *s)
{
	const struct ps_config *cfg = s->cfg;
	int32_t nt = cfg->declare ? cfg->ntensors : 0, nd = cfg->ndecl_tables;
	int32_t ng = nt ? cfg->ngroups : 0;
	uint64_t h = 0xcbf29ce484222325ull;

	if (!nt && !nd)
		return 0;
	h = fnv(h, &nt, sizeof(nt));
	h = fnv(h, &nd, sizeof(nd));
	h = fnv(h, &ng, sizeof(ng));
	for (int i = 0; i < nt; i++) {
		const struct ps_tensor_cfg *t = &cfg->tensors[i];
		int32_t v[2] = { t->ndims, ng ? t->group : 0 };
		h = fnv(h, t->name, strlen(t->name) + 1);
		h = fnv(h, v, sizeof(v));
		h = fnv(h, t->dims, sizeof(t->dims[0]) * (size_t)t->ndims);
	}
	for (int i = cfg->ntables - nd; i < cfg->ntables; i++) {
		const struct ps_table_cfg *t = &cfg->tables[i];
		int32_t v[4] = { t->dim, (int32_t)t->init, t->optimizer, t->admission };
		h = fnv(h, t->name, strlen(t->name) + 1);
		h = fnv(h, v, sizeof(v));
		h = fnv(h, &t->max_rows, sizeof(t->max_rows));
	}
	return h ? h : 1;
}

void ps__srv_handle_declare(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Declare *m,
			    const struct ps_frame *f)
{
	char why[600];
	int rc, adopted;

	if (sc->rank < 0) {
		rc = PS_EAUTH;
		snprintf(why, sizeof(why), "only a worker may declare tensors, not a monitor");
		goto refuse;
	}
	if (!s->cfg->ntensors && ps__srv_stop_fences_decl(s, sc->rank)) {
		/* a re-shard's stop pending (stop.c): a declaration taken by
		 * some old shards only is a mix the new shards refuse. The
		 * client asks again; on the new map once it follows
		 * (ps_client_declare.c) */
		rc = PS_ERESHARD;
		snprintf(why, sizeof(why), "the shard stops at clock %" PRIu64 " for a re-shard: "
			 "tensors are declared on the new map (asked again)", s->stop_at);
		goto refuse;
	}
	rc = ps__srv_declare_msg(s, sc->rank, m, f->payload, f->hdr.payload_len, &adopted, why,
				 sizeof(why));
	if (rc)
		goto refuse;
	if (adopted)
		ps_info("rank 0 declared %d tensors (%d optimizer groups): %d slices here, %.1f MiB, "
			"map %016" PRIx64, s->cfg->ntensors, s->cfg->ngroups, s->store.nslots,
			(double)s->map.shard_bytes[s->shard] / 1048576.0, s->map.hash);
	/* replicated: the declaration goes to the backup with the next batch,
	 * and the ack waits until the backup confirmed it */
	if (s->repl) {
		if (adopted)
			ps__repl_note_declare(s, m, f->payload, f->hdr.payload_len);
		if (!ps__repl_decl_accepted(s, sc, m->req_id))
			return;
		rc = -ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	Ps__PushAck ack = PS__PUSH_ACK__INIT;
	ack.req_id = m->req_id;
	ps_msg_send(sc->conn, PS_MSG_PUSH_ACK, &ack.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
	return;

refuse:
	if (rc != -EAGAIN && rc != PS_ERESHARD) {
		s->c.errors++;
		ps_warn("declaration from %s (rank %d) refused: %s", sc->conn->peer, sc->rank, why);
	}
	ps_msg_send_error(sc->conn, m->req_id, rc, "%s", why);
}
