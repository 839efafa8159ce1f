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
 * Declared tables are left out of the shard-map hash (shardmap.c), as
 * declared tensors are: the same config gives the same hash before and
 * after, and the declaration is compared instead.
 *
 * Everything a peer sends is bounded before anything is allocated: the
 * count (1..PS_MAX_TABLES with the config's tables), each definition
 * (ps_table_decl_from_msg: model.embeddings[]'s bounds), no name twice
 * and none of a config table.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
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

void ps__srv_handle_declare_tables(struct ps_server *s, struct ps_srv_conn *sc,
				   const Ps__DeclareTables *m)
{
	struct ps_table_cfg *list = NULL;
	char why[600];
	int rc, n = (int)m->n_tables;

	if (sc->rank < 0) {
		rc = PS_EAUTH;
		snprintf(why, sizeof(why), "only a worker may declare tables, not a monitor");
		goto refuse;
	}
	if (s->cfg->replicas) {
		rc = PS_ECONFIG;
		snprintf(why, sizeof(why), "cluster.replicas: 1 does not replicate embedding tables "
			 "yet; declared tables need replicas: 0");
		goto refuse;
	}
	if (m->n_tables < 1 ||
	    m->n_tables > (size_t)(PS_MAX_TABLES - (s->cfg->ntables - s->cfg->ndecl_tables))) {
		rc = PS_ETOOBIG;
		snprintf(why, sizeof(why), "declaration of %zu tables: expected 1..%d (at most %d "
			 "with the config's %d)", m->n_tables,
			 PS_MAX_TABLES - (s->cfg->ntables - s->cfg->ndecl_tables), PS_MAX_TABLES,
			 s->cfg->ntables - s->cfg->ndecl_tables);
		goto refuse;
	}
	list = calloc((size_t)n, sizeof(*list));
	if (!list) {
		rc = -ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	rc = parse_tables(s->cfg, m, list, why, sizeof(why));
	if (rc)
		goto refuse;
	if (s->cfg->ndecl_tables) {
		/* declared before (or restored from the checkpoint) */
		rc = compare(s->cfg, list, n, why, sizeof(why));
		if (rc)
			goto refuse;
	} else if (sc->rank != 0) {
		rc = -EAGAIN;
		snprintf(why, sizeof(why), "no tables declared yet: waiting for rank 0's declaration");
		goto refuse;
	} else {
		rc = ps__srv_tables_adopt(s, list, n, why, sizeof(why));
		if (rc)
			goto refuse;
		ps_info("rank 0 declared %d embedding tables (%d with the config's)", n,
			s->cfg->ntables);
	}
	free(list);
	Ps__PushAck ack = PS__PUSH_ACK__INIT;
	ack.req_id = m->req_id;
	ps_msg_send(sc->conn, PS_MSG_PUSH_ACK, &ack.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
	return;

refuse:
	free(list);
	if (rc != -EAGAIN) {
		s->c.errors++;
		ps_warn("table declaration from %s (rank %d) refused: %s", sc->conn->peer, sc->rank,
			why);
	}
	ps_msg_send_error(sc->conn, m->req_id, rc, "%s", why);
}
