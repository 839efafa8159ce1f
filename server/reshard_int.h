/* reshard_int.h - what reshard.c (the merge of the old shards' states)
 * gives reshard_stage.c (the staged start, the pre-copy). Internal to the
 * shard.
 */
#ifndef PS_RESHARD_INT_H
#define PS_RESHARD_INT_H

#include <stdint.h>
#include <sys/stat.h>
#include "config.h"
#include "reshard.h"
#include "table.h"

struct ps_server;

/* What a staged start loaded (stage_load): every old shard's scratch
 * shard, from the files in checkpoint.dir, brought up to the stop by the
 * incremental checkpoints in --reshard-from once the commit came; and
 * the new shard's tables merged from them before the stop
 * (ps__reshard_premerge). */
struct ps__staged {
	int n, placement;
	int keep, keep_n;       /* this shard, of this many (what the scratch tables keep) */
	struct ps_config *ocfg;
	struct ps_server *o;    /* n scratch shards */
	struct stat *base;      /* each one's full file as it was read */
	uint32_t *seq;          /* incremental ones applied to it */
	int premerged;          /* the new shard's tables hold the premerge */
	int reloaded;           /* an old shard's file loaded again whole (its base
				 * replaced): the premerge cannot be brought up */
	int64_t kref[PS_MAX_TABLES]; /* each one's key (wall-clock second) of stamp 0 */
};

/* The rows of one table moving into this shard, gathered from every old
 * shard, then inserted in order of their keys (reshard_rows.c). */
struct ps__gathered {
	uint64_t n, cap;
	uint64_t run[PS_MAX_SHARDS + 1]; /* old shard j's rows: [run[j], run[j + 1]) */
	uint64_t *id;
	double *t;              /* key: last update, whole wall-clock seconds */
	uint32_t *from;         /* old shard */
	float *vals;            /* row_floats each (refs: none) */
	/* refs (the old shards all stay loaded): the row's place in old shard
	 * from's table instead of a copy of its values */
	int refs;
	uint32_t *row;
	int row_floats;
};

/* A shard of the old map (cfg with its shard count) set up only to load
 * its checkpoint; its tables keep only the rows shard keep of keep_n will
 * own. old_close frees it. */
int ps__reshard_old_open(struct ps_server *o, const struct ps_config *cfg, int shard,
			 int placement, int keep, int keep_n);
void ps__reshard_old_close(struct ps_server *o);
/* Opens old shard j and loads its checkpoint at path with its incremental
 * ones, as a shard of the old map would; err names the file. */
int ps__reshard_old_load(struct ps_server *o, const struct ps_config *ocfg, int j, int placement,
			 int keep, int keep_n, const char *path, char *err, size_t errlen);
/* The placement old shard 0's file at path was made with, or a negative
 * code with err. */
int ps__reshard_find_placement(const struct ps_config *ocfg, const char *path, int n, char *err,
			       size_t errlen);
/* Merges into s what it owns of the old shards' states: loaded from
 * from->dir, or, with pre, those a staged start loaded. */
int ps__reshard_merge(struct ps_server *s, const struct ps_reshard_from *from,
		      struct ps__staged *pre, char *err, size_t errlen);

/* reshard_rows.c. Room for c rows in all (0 or -ENOMEM); free. */
int ps__gather_grow(struct ps__gathered *g, uint64_t c);
void ps__gather_free(struct ps__gathered *g);
/* Adds old shard j's rows of scratch table ot that shard of nshards
 * owns (table tb there) to g as run j, oldest first; *moved counts them
 * when j is not shard. 0 or -ENOMEM. */
int ps__gather_rows(struct ps__gathered *g, const struct ps_table *ot, const struct ps_table *tb,
		    int j, int shard, int nshards, uint64_t *moved);
/* Inserts g's rows (n runs; refs: into olds[j]'s table t) into the empty
 * table tb, merged by key, stamps from the oldest key, which goes to
 * *oldest (untouched when there are none). 0 or a negative code with err. */
int ps__insert_rows(struct ps_table *tb, struct ps__gathered *g, int n, struct ps_server *olds,
		    int t, double *oldest, char *err, size_t errlen);
/* Empties s's tables again (a premerge given up). 0 or -ENOMEM. */
int ps__reshard_reset_tables(struct ps_server *s);
/* Staged: merges the scratch tables st->o into s's tables before the
 * stop (no cap), and has the scratch tables keep the marks of the stop's
 * changes. 0 or a negative code with err. */
int ps__reshard_premerge(struct ps_server *s, struct ps__staged *st, char *err, size_t errlen);
/* Whether every scratch table's changes since the premerge can be
 * applied to it (ids dropped all remembered, rows changed at the newest
 * end in key order). */
int ps__reshard_apply_possible(const struct ps__staged *st, int nt);
/* Applies them to s's table t, then its cap (*dropped: rows dropped for
 * it); *oldest: the oldest key (untouched when the table is empty). */
int ps__reshard_apply(struct ps_server *s, struct ps__staged *st, int t, double *oldest,
		      uint64_t *dropped, char *err, size_t errlen);

#endif
