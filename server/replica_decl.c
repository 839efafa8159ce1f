/* replica_decl.c - declarations made at run time in replication
 * (replica.h): dense tensors a config without a model leaves to the
 * workers (declare.c) and embedding tables beside model.embeddings
 * (decl_tables.c).
 *
 * The primary forwards each declaration it adopts in the batch it is
 * gathering: a copy of the worker's message, the initial values of this
 * shard's slices in the payload, and each new table's clock and version.
 * The backup applies it first, before anything else of the batch, by the
 * same functions the worker's message went through (so the same checks),
 * as rank 0's: both processes then hold the same tensors, slices and
 * tables. The ack of the declaration waits in the pending list until the
 * backup confirmed that batch, as a push's does.
 *
 * A joining process gets the declared lists in the first frame of its
 * state transfer, built from the primary's config copy, before the
 * slices' and tables' frames that need them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "msg.h"
#include "optim_group.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"
#include "table_decl.h"

/* A deep copy of m (packed and unpacked), or NULL when out of memory. */
static ProtobufCMessage *copy_msg(const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);
	ProtobufCMessage *c = NULL;

	if (buf) {
		protobuf_c_message_pack(m, buf);
		c = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
		free(buf);
	}
	return c;
}

/* Out of memory gathering the batch: the backup can no longer follow;
 * closing the link makes this primary step down (ps__repl_link_closed). */
static void give_up(struct ps_server *s)
{
	ps_error("replication: out of memory gathering a declaration; stepping down");
	if (s->repl->link)
		s->repl->link->conn->t->ops->close(s->repl->link->conn, -ENOMEM);
}

void ps__repl_note_declare(struct ps_server *s, const Ps__Declare *m, const void *values,
			   uint64_t len)
{
	struct ps_repl_batch *b = &s->repl->b;
	Ps__Declare *d;

	if (s->repl->state != PS_REPL_PRIMARY)
		return;
	/* the values alone fill up to a frame, as the worker's did: what is
	 * gathered goes first, in a batch of its own */
	if (b->nslots || b->nrows || b->nmarks)
		ps__repl_send_batch(s, 1);
	d = (Ps__Declare *)copy_msg(&m->base);
	b->decl_values = malloc(len ? len : 1);
	if (!d || !b->decl_values) {
		if (d)
			protobuf_c_message_free_unpacked(&d->base, NULL);
		give_up(s);
		return;
	}
	d->req_id = 0;
	if (len)
		memcpy(b->decl_values, values, len);
	b->decl_len = len;
	b->decl = d;
}

void ps__repl_note_declare_tables(struct ps_server *s, const Ps__DeclareTables *m)
{
	struct ps_repl_batch *b = &s->repl->b;
	int first = s->rows->ntables - (int)m->n_tables;
	double now, wall = ps_wall_mono_s(&now);
	Ps__DeclareTables *d;

	if (s->repl->state != PS_REPL_PRIMARY)
		return;
	d = (Ps__DeclareTables *)copy_msg(&m->base);
	b->decl_clocks = calloc(m->n_tables, sizeof(*b->decl_clocks));
	b->decl_versions = calloc(m->n_tables, sizeof(*b->decl_versions));
	if (!d || !b->decl_clocks || !b->decl_versions) {
		if (d)
			protobuf_c_message_free_unpacked(&d->base, NULL);
		give_up(s);
		return;
	}
	d->req_id = 0;
	for (size_t i = 0; i < m->n_tables; i++) {
		const struct ps_table *tb = &s->rows->t[first + (int)i].tb;
		b->decl_clocks[i] = now - tb->epoch;
		b->decl_versions[i] = tb->version;
	}
	b->ndecl = m->n_tables;
	b->decl_wall = wall;
	b->decl_tables = d;
}

void ps__repl_decl_clear(struct ps_repl_batch *b)
{
	if (b->decl)
		protobuf_c_message_free_unpacked(&b->decl->base, NULL);
	if (b->decl_tables)
		protobuf_c_message_free_unpacked(&b->decl_tables->base, NULL);
	free(b->decl_values);
	free(b->decl_clocks);
	free(b->decl_versions);
	b->decl = NULL;
	b->decl_tables = NULL;
	b->decl_values = NULL;
	b->decl_clocks = NULL;
	b->decl_versions = NULL;
	b->decl_len = 0;
	b->ndecl = 0;
	b->decl_wall = 0;
}

void ps__repl_decl_fill(struct ps_repl_batch *b, Ps__ReplBatch *m, uint64_t offset)
{
	m->declare = b->decl;
	m->declare_offset = b->decl ? offset : 0;
	m->declare_length = b->decl ? b->decl_len : 0;
	m->declare_tables = b->decl_tables;
	m->n_decl_table_clocks = b->decl_tables ? b->ndecl : 0;
	m->decl_table_clocks = b->decl_clocks;
	m->n_decl_table_versions = b->decl_tables ? b->ndecl : 0;
	m->decl_table_versions = b->decl_versions;
	m->decl_table_clocks_wall = b->decl_tables ? b->decl_wall : 0;
}

/* ---- the backup's side ---- */

/* The tables [first, first + n) were declared here as on the primary:
 * their epochs and versions become the primary's (the epochs on the wall
 * clock both share: the batch's delay does not move them). */
static void tables_as_primary(struct ps_server *s, int first, size_t n, const double *clocks,
			      double wall, const uint64_t *versions)
{
	double now, wnow = ps_wall_mono_s(&now);

	now -= ps__repl_since_wall(wall, wnow, 0, 0, "a declaration of tables");
	for (size_t i = 0; i < n; i++) {
		struct ps_table *tb = &s->rows->t[first + (int)i].tb;
		tb->epoch = now - clocks[i];
		tb->version = versions[i];
	}
}

int ps__repl_decl_apply(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f)
{
	char why[600];
	int rc, adopted;

	if (m->declare) {
		if (m->declare_offset > f->hdr.payload_len ||
		    m->declare_length > f->hdr.payload_len - m->declare_offset) {
			ps_warn("replication: batch %" PRIu64 " declares tensors with values at %" PRIu64
				"..+%" PRIu64 " of a %" PRIu64 "-byte payload", m->lsn,
				m->declare_offset, m->declare_length, f->hdr.payload_len);
			return PS_EPROTO;
		}
		rc = ps__srv_declare_msg(s, 0, m->declare, f->payload + m->declare_offset,
					 m->declare_length, &adopted, why, sizeof(why));
		if (rc) {
			ps_warn("replication: batch %" PRIu64 ": the primary's declaration of tensors "
				"does not hold here: %s", m->lsn, why);
			return rc == -EAGAIN ? PS_EPROTO : rc;
		}
		if (adopted)
			ps_info("replication: the primary's %d declared tensors adopted (%d slices "
				"here)", s->cfg->ntensors, s->store.nslots);
	}
	if (m->declare_tables) {
		size_t n = m->declare_tables->n_tables;
		if (m->n_decl_table_clocks != n || m->n_decl_table_versions != n) {
			ps_warn("replication: batch %" PRIu64 " declares %zu tables with %zu clocks and "
				"%zu versions", m->lsn, n, m->n_decl_table_clocks,
				m->n_decl_table_versions);
			return PS_EPROTO;
		}
		if (!(m->decl_table_clocks_wall >= 0 && m->decl_table_clocks_wall < 1e11)) {
			ps_warn("replication: batch %" PRIu64 " declares tables with their clocks read "
				"at %g s of the primary's wall clock: out of range", m->lsn,
				m->decl_table_clocks_wall);
			return PS_EPROTO;
		}
		for (size_t i = 0; i < n; i++)
			if (!(m->decl_table_clocks[i] >= 0 && m->decl_table_clocks[i] < 4e9) ||
			    m->decl_table_versions[i] >= PS_MAX_CLOCK) {
				ps_warn("replication: batch %" PRIu64 " declares table %zu at %g s since "
					"its epoch, version %" PRIu64 ": out of range", m->lsn, i,
					m->decl_table_clocks[i], m->decl_table_versions[i]);
				return PS_EPROTO;
			}
		rc = ps__srv_declare_tables_msg(s, 0, m->declare_tables, &adopted, why, sizeof(why));
		if (rc) {
			ps_warn("replication: batch %" PRIu64 ": the primary's declaration of tables "
				"does not hold here: %s", m->lsn, why);
			return rc == -EAGAIN ? PS_EPROTO : rc;
		}
		if (adopted) {
			tables_as_primary(s, s->rows->ntables - (int)n, n, m->decl_table_clocks,
					  m->decl_table_clocks_wall, m->decl_table_versions);
			ps_info("replication: the primary's %zu declared tables adopted", n);
		}
	}
	return 0;
}

/* ---- the state transfer's first frame ---- */

/* The shard's declared lists as messages, pointing into s->cfg and arrays
 * of its own (freed by build_free). */
struct decl_build {
	Ps__Declare d;
	Ps__DeclareTables dt;
	char **names;
	uint32_t *ndims, *group_of;
	int64_t *dims;
	Ps__OptimGroup *g, **gp;
	Ps__TableDef *td, **tdp;
};

static void build_free(struct decl_build *x)
{
	free(x->names);
	free(x->ndims);
	free(x->group_of);
	free(x->dims);
	free(x->g);
	free(x->gp);
	free(x->td);
	free(x->tdp);
}

static int build(const struct ps_server *s, struct decl_build *x)
{
	const struct ps_config *cfg = s->cfg;
	size_t n = (size_t)cfg->ntensors, nd = 0, ng = (size_t)cfg->ngroups;
	size_t nt = (size_t)cfg->ndecl_tables;
	int first = cfg->ntables - cfg->ndecl_tables;

	memset(x, 0, sizeof(*x));
	ps__declare__init(&x->d);
	ps__declare_tables__init(&x->dt);
	for (size_t i = 0; cfg->declare && i < n; i++)
		nd += (size_t)cfg->tensors[i].ndims;
	x->names = calloc(n + 1, sizeof(*x->names));
	x->ndims = calloc(n + 1, sizeof(*x->ndims));
	x->group_of = calloc(n + 1, sizeof(*x->group_of));
	x->dims = calloc(nd + 1, sizeof(*x->dims));
	x->g = calloc(ng + 1, sizeof(*x->g));
	x->gp = calloc(ng + 1, sizeof(*x->gp));
	x->td = calloc(nt + 1, sizeof(*x->td));
	x->tdp = calloc(nt + 1, sizeof(*x->tdp));
	if (!x->names || !x->ndims || !x->group_of || !x->dims || !x->g || !x->gp || !x->td ||
	    !x->tdp) {
		build_free(x);
		return -ENOMEM;
	}
	if (cfg->declare && n) {
		nd = 0;
		for (size_t i = 0; i < n; i++) {
			const struct ps_tensor_cfg *t = &cfg->tensors[i];
			x->names[i] = (char *)t->name;
			x->ndims[i] = (uint32_t)t->ndims;
			x->group_of[i] = (uint32_t)t->group;
			for (int j = 0; j < t->ndims; j++)
				x->dims[nd++] = t->dims[j];
		}
		for (size_t g = 0; g < ng; g++) {
			ps_optim_group_to_msg(&cfg->groups[g], &x->g[g]);
			x->gp[g] = &x->g[g];
		}
		x->d.n_names = x->d.n_ndims = n;
		x->d.names = x->names;
		x->d.ndims = x->ndims;
		x->d.n_dims = nd;
		x->d.dims = x->dims;
		x->d.n_groups = ng;
		x->d.groups = x->gp;
		x->d.n_group_of = ng ? n : 0;
		x->d.group_of = x->group_of;
	}
	for (size_t i = 0; i < nt; i++) {
		ps_table_decl_to_msg(&cfg->tables[first + (int)i], &x->td[i]);
		x->tdp[i] = &x->td[i];
	}
	x->dt.n_tables = nt;
	x->dt.tables = x->tdp;
	return 0;
}

int ps__repl_send_decl(struct ps_server *s, struct ps_srv_conn *sc, uint64_t lsn, uint64_t epoch)
{
	const struct ps_config *cfg = s->cfg;
	Ps__ReplSnapshot m = PS__REPL_SNAPSHOT__INIT;
	struct decl_build x;
	int rc;

	if (!(cfg->declare && cfg->ntensors) && !cfg->ndecl_tables)
		return 0;
	rc = build(s, &x);
	if (rc)
		return rc;
	m.lsn = lsn;
	m.epoch = epoch;
	m.declare = cfg->declare && cfg->ntensors ? &x.d : NULL;
	m.declare_tables = cfg->ndecl_tables ? &x.dt : NULL;
	rc = ps_msg_send(sc->conn, PS_MSG_REPL_SNAPSHOT, &m.base, NULL, 0, PS_SEND_VOLATILE, NULL,
			 NULL);
	build_free(&x);
	return rc;
}

int ps__repl_snapshot_decl(struct ps_server *s, const Ps__ReplSnapshot *m)
{
	char why[600];
	int rc, adopted;

	if (m->declare) {
		/* no values: the slices' frames that follow carry them (zeros
		 * until then) */
		Ps__Declare d = *m->declare;
		d.values = 1;
		rc = ps__srv_declare_msg(s, 0, &d, NULL, 0, &adopted, why, sizeof(why));
		if (rc) {
			ps_warn("replication: the primary's declared tensors do not hold here: %s", why);
			return rc == -EAGAIN ? PS_EPROTO : rc;
		}
		if (adopted)
			ps_info("replication: the primary's %d declared tensors adopted from its state",
				s->cfg->ntensors);
	}
	if (m->declare_tables) {
		rc = ps__srv_declare_tables_msg(s, 0, m->declare_tables, &adopted, why, sizeof(why));
		if (rc) {
			ps_warn("replication: the primary's declared tables do not hold here: %s", why);
			return rc == -EAGAIN ? PS_EPROTO : rc;
		}
		/* their rows, epochs and versions come with the tables' image */
		if (adopted)
			ps_info("replication: the primary's %zu declared tables adopted from its state",
				m->declare_tables->n_tables);
	}
	return 0;
}
