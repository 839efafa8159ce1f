/* decl_tables.c - embedding tables declared at run time
 * (ps_client_declare_tables; docs/embeddings.md).
 *
 * A worker's DeclareTables names tables beside the config's
 * model.embeddings, each with the keys of a model.embeddings entry. The
 * first accepted declaration, rank 0's, creates them: the shard appends
 * them to its own config copy (s->decl_cfg, shared with declared tensors,
 * declare.c) and sets up their rows (rows.c), placed, initialized and
 * updated exactly as a YAML table's. Later declarations (other ranks,
 * restarted workers) must name the same list: an ack, or PS_ECONFIG
 * naming the table and the differing field with both values. Another
 * rank's declaration before rank 0's is answered -EAGAIN (the client asks
 * again). The checkpoint carries the definitions (checkpoint.c), so a
 * restarted shard has its tables back before any worker declares.
 *
 * With cluster.replicas: 1 the primary forwards the tables it adopts to
 * its backup in its next batch, and a joining backup gets them first in
 * its state transfer (replica_decl.c); the ack waits for the backup.
 *
 * Declared tables are left out of the shard-map hash (shardmap.c), as
 * declared tensors are: the same config gives the same hash before and
 * after, and the declaration is compared instead.
 *
 * Everything a peer sends is bounded before anything is allocated: the
 * count (1..PS_MAX_TABLES with the config's tables), each definition
 * (ps_table_decl_from_msg: model.embeddings[]'s bounds), no name twice
 * and none of a config table.
 *
 * The checkpoint's section of declared tables (file versions 3 and 4,
 * checkpoint.c) is written and read here too: the definitions, in
 * declaration order, before the slices; the rows follow with the other
 * tables' (table_ckpt.c). The records are ckpt_format.h's (shared with
 * ps-export).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ckpt_format.h"
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"
#include "table_decl.h"

/* Checks and converts m's tables into list. 0, or a negative code with
 * the reason in why. */
static int parse_tables(const struct ps_config *cfg, const Ps__DeclareTables *m,
			struct ps_table_cfg *list, char *why, size_t wl)
{
	int nyaml = cfg->ntables - cfg->ndecl_tables;

	for (size_t i = 0; i < m->n_tables; i++) {
		int rc = ps_table_decl_from_msg(m->tables[i], &list[i], why, wl);
		if (rc)
			return rc;
		for (int t = 0; t < nyaml; t++)
			if (!strcmp(cfg->tables[t].name, list[i].name)) {
				snprintf(why, wl, "table '%s' is a table of the config (model.embeddings "
					 "of %.200s): a declared table needs a name of its own",
					 list[i].name, cfg->path);
				return PS_ECONFIG;
			}
		for (size_t j = 0; j < i; j++)
			if (!strcmp(list[j].name, list[i].name)) {
				snprintf(why, wl, "table '%s' declared twice", list[i].name);
				return PS_ECONFIG;
			}
	}
	return 0;
}

/* 0 when list (n) equals the shard's declared tables; else PS_ECONFIG with
 * the first difference in why. */
static int compare(const struct ps_config *cfg, const struct ps_table_cfg *list, int n,
		   char *why, size_t wl)
{
	const struct ps_table_cfg *have = &cfg->tables[cfg->ntables - cfg->ndecl_tables];
	char d[400];

	for (int i = 0; i < n && i < cfg->ndecl_tables; i++)
		if (ps_table_decl_diff(&have[i], &list[i], "on the shard", "in this declaration", d,
				       sizeof(d))) {
			snprintf(why, wl, "declared table #%d differs: %s", i, d);
			return PS_ECONFIG;
		}
	if (n != cfg->ndecl_tables) {
		snprintf(why, wl, "the shard has %d declared tables, this declaration names %d (first "
			 "extra: '%s')", cfg->ndecl_tables, n, n > cfg->ndecl_tables
			 ? list[cfg->ndecl_tables].name : have[n].name);
		return PS_ECONFIG;
	}
	return 0;
}

int ps__rows_add_tables(struct ps_server *s, int first)
{
	const struct ps_config *cfg = s->cfg;
	struct ps_srv_rows *R = s->rows;
	int rc;

	for (int t = first; t < cfg->ntables; t++) {
		rc = ps_table_init(&R->t[t].tb, cfg, t, cfg->nshards, ps_now_s());
		if (rc) {
			while (--t >= first)
				ps_table_free(&R->t[t].tb);
			return rc;
		}
		/* a re-shard's scratch shard (reshard.c): its share only */
		R->t[t].tb.keep_shard = R->keep_shard;
		R->t[t].tb.keep_nshards = R->keep_nshards;
	}
	R->ntables = cfg->ntables;
	/* the memory budget is shared by more tables now */
	for (int t = 0; t < R->ntables; t++)
		ps_table_set_cap(&R->t[t].tb, cfg, cfg->nshards);
	/* sync: a new table's version catches up with the clocks every live
	 * worker has finished */
	ps__rows_advance(s);
	return 0;
}

void ps__rows_rebind(struct ps_server *s)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		s->rows->t[t].tb.cfg = s->cfg;
		s->rows->t[t].tb.tc = &s->cfg->tables[t];
	}
}

int ps__srv_tables_adopt(struct ps_server *s, const struct ps_table_cfg *list, int n, char *why,
			 size_t wl)
{
	struct ps_config *cfg = s->decl_cfg;
	int first = s->cfg->ntables, rc;

	if (first + n > PS_MAX_TABLES) {
		snprintf(why, wl, "%d tables with the config's %d: at most %d", n, first,
			 PS_MAX_TABLES);
		return PS_ETOOBIG;
	}
	if (!cfg) {
		/* the shard's own copy, as declared tensors make (declare.c);
		 * what pointed to the loaded config still may: it stays */
		cfg = malloc(sizeof(*cfg));
		if (!cfg) {
			snprintf(why, wl, "out of memory");
			return -ENOMEM;
		}
		memcpy(cfg, s->cfg, sizeof(*cfg));
		s->decl_cfg = cfg;
		s->cfg = cfg;
		ps__rows_rebind(s);
	}
	memcpy(&cfg->tables[first], list, sizeof(*list) * (size_t)n);
	cfg->ntables = first + n;
	cfg->ndecl_tables += n;
	rc = ps__rows_add_tables(s, first);
	if (rc) {
		cfg->ntables = first;
		cfg->ndecl_tables -= n;
		snprintf(why, wl, "cannot set up the tables: %s", ps_strerror(rc));
	}
	return rc;
}

int ps__srv_declare_tables_msg(struct ps_server *s, int rank, const Ps__DeclareTables *m,
			       int *adopted, char *why, size_t wl)
{
	struct ps_table_cfg *list = NULL;
	int rc, n = (int)m->n_tables;

	*adopted = 0;
	if (m->n_tables < 1 ||
	    m->n_tables > (size_t)(PS_MAX_TABLES - (s->cfg->ntables - s->cfg->ndecl_tables))) {
		snprintf(why, wl, "declaration of %zu tables: expected 1..%d (at most %d "
			 "with the config's %d)", m->n_tables,
			 PS_MAX_TABLES - (s->cfg->ntables - s->cfg->ndecl_tables), PS_MAX_TABLES,
			 s->cfg->ntables - s->cfg->ndecl_tables);
		return PS_ETOOBIG;
	}
	list = calloc((size_t)n, sizeof(*list));
	if (!list) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	rc = parse_tables(s->cfg, m, list, why, wl);
	if (rc)
		goto out;
	if (s->cfg->ndecl_tables) {
		/* declared before (or restored from the checkpoint, or sent by
		 * the primary) */
		rc = compare(s->cfg, list, n, why, wl);
	} else if (rank != 0) {
		rc = -EAGAIN;
		snprintf(why, wl, "no tables declared yet: waiting for rank 0's declaration");
	} else {
		rc = ps__srv_tables_adopt(s, list, n, why, wl);
		*adopted = !rc;
	}
out:
	free(list);
	return rc;
}

void ps__srv_handle_declare_tables(struct ps_server *s, struct ps_srv_conn *sc,
				   const Ps__DeclareTables *m)
{
	char why[600];
	int rc, adopted;

	if (sc->rank < 0) {
		rc = PS_EAUTH;
		snprintf(why, sizeof(why), "only a worker may declare tables, not a monitor");
		goto refuse;
	}
	if (!s->cfg->ndecl_tables && ps__srv_stop_fences_decl(s, sc->rank)) {
		/* a re-shard's stop pending: as for tensors (declare.c) */
		rc = PS_ERESHARD;
		snprintf(why, sizeof(why), "the shard stops at clock %" PRIu64 " for a re-shard: "
			 "tables are declared on the new map (asked again)", s->stop_at);
		goto refuse;
	}
	rc = ps__srv_declare_tables_msg(s, sc->rank, m, &adopted, why, sizeof(why));
	if (rc)
		goto refuse;
	if (adopted)
		ps_info("rank 0 declared %zu embedding tables (%d with the config's)", m->n_tables,
			s->cfg->ntables);
	/* replicated: the declaration goes to the backup with the next batch,
	 * and the ack waits until the backup confirmed it */
	if (s->repl) {
		if (adopted)
			ps__repl_note_declare_tables(s, m);
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
		ps_warn("table declaration from %s (rank %d) refused: %s", sc->conn->peer, sc->rank,
			why);
	}
	ps_msg_send_error(sc->conn, m->req_id, rc, "%s", why);
}

/* ---- the checkpoint's section ---- */

/* Reads exactly n bytes at offset off; 0 or -1 with errno (EIO at the end). */
static int read_at(int fd, void *p, size_t n, uint64_t off)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

size_t ps__srv_tables_ckpt_size(const struct ps_server *s)
{
	return s->cfg->ndecl_tables ? sizeof(struct ckpt_tables_head) +
		(size_t)s->cfg->ndecl_tables * sizeof(struct ckpt_table_decl) : 0;
}

void ps__srv_tables_ckpt_put(const struct ps_server *s, uint8_t *b)
{
	const struct ps_config *cfg = s->cfg;
	struct ckpt_tables_head th = { .ntables = (uint32_t)cfg->ndecl_tables };
	size_t pos = sizeof(th);

	memcpy(b, &th, sizeof(th));
	for (int t = cfg->ntables - cfg->ndecl_tables; t < cfg->ntables; t++) {
		const struct ps_table_cfg *tc = &cfg->tables[t];
		struct ckpt_table_decl d;

		memset(&d, 0, sizeof(d));
		memcpy(d.name, tc->name, sizeof(d.name));
		d.dim = (uint32_t)tc->dim;
		d.init = (uint32_t)tc->init;
		d.optimizer = (uint32_t)tc->optimizer;
		d.admission = (uint32_t)tc->admission;
		d.init_value = tc->init_value;
		d.lr = tc->lr;
		d.eps = tc->eps;
		d.beta1 = tc->beta1;
		d.beta2 = tc->beta2;
		d.initial_accumulator = tc->initial_accumulator;
		d.l1 = tc->l1;
		d.l2 = tc->l2;
		d.ftrl_beta = tc->ftrl_beta;
		d.ttl_s = (uint32_t)tc->ttl_s;
		d.max_rows = (uint64_t)tc->max_rows;
		d.filter_ids = (uint64_t)tc->filter_ids;
		memcpy(b + pos, &d, sizeof(d));
		pos += sizeof(d);
	}
}

#define FAIL(code, ...) do { snprintf(err, errlen, __VA_ARGS__); rc = (code); goto out; } while (0)

/* Versions 3 and 4: the declared tables at pos, each checked as a
 * worker's declaration is (table_decl.c), made the shard's when it has
 * none yet (at the start, before any worker declared), else compared with
 * them (an incremental checkpoint after its full one). */
int ps__srv_tables_ckpt_load(struct ps_server *s, int fd, uint64_t pos, uint64_t len,
			     const char *path, char *err, size_t errlen)
{
	const struct ps_config *cfg = s->cfg;
	int nyaml = cfg->ntables - cfg->ndecl_tables, rc = 0;
	struct ps_table_cfg *list = NULL;
	struct ckpt_tables_head th;
	char why[400];

	if (read_at(fd, &th, sizeof(th), pos))
		FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
	pos += sizeof(th);
	if (th.ntables < 1 || th.ntables > (uint32_t)(PS_MAX_TABLES - nyaml) ||
	    len < pos + (uint64_t)th.ntables * sizeof(struct ckpt_table_decl))
		FAIL(PS_EPROTO, "%s: %u declared tables: expected 1..%d beside the config's %d, "
		     "within the file (damaged?)", path, th.ntables, PS_MAX_TABLES - nyaml, nyaml);
	list = calloc(th.ntables, sizeof(*list));
	if (!list)
		FAIL(-ENOMEM, "%s: out of memory", path);
	for (uint32_t i = 0; i < th.ntables; i++, pos += sizeof(struct ckpt_table_decl)) {
		struct ckpt_table_decl d;
		struct ps_table_cfg *t = &list[i];

		if (read_at(fd, &d, sizeof(d), pos))
			FAIL(PS_EPROTO, "%s: cannot read: %s", path, strerror(errno));
		if (ckpt_table_decl_get(&d, t))
			FAIL(PS_EPROTO, "%s: declared table %u is damaged", path, i);
		if (ps_table_decl_check(t, why, sizeof(why)))
			FAIL(PS_EPROTO, "%s: declared table %u is damaged: %s", path, i, why);
		for (int j = 0; j < nyaml; j++)
			if (!strcmp(cfg->tables[j].name, t->name))
				FAIL(PS_ECONFIG, "%s: declared table '%s' is now a table of the config "
				     "(model.embeddings)", path, t->name);
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(list[j].name, t->name))
				FAIL(PS_EPROTO, "%s: declared table '%s' twice (damaged?)", path, t->name);
	}
	if (!cfg->ndecl_tables) {
		rc = ps__srv_tables_adopt(s, list, (int)th.ntables, why, sizeof(why));
		if (rc)
			FAIL(rc, "%s: its declared tables: %s", path, why);
	} else {
		int same = (int)th.ntables == cfg->ndecl_tables;
		for (uint32_t i = 0; same && i < th.ntables; i++)
			same = !ps_table_decl_diff(&cfg->tables[nyaml + (int)i], &list[i], "", "", why,
						   sizeof(why));
		if (!same)
			FAIL(PS_ECONFIG, "%s: declares other tables than its full checkpoint", path);
	}
out:
	free(list);
	return rc;
}
