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

struct ps_server;

/* What a staged start loaded (stage_load): every old shard's scratch
 * shard, from the files in checkpoint.dir, brought up to the stop by the
 * incremental checkpoints in --reshard-from once the commit came. */
struct ps__staged {
	int n, placement;
	int keep, keep_n;       /* this shard, of this many (what the scratch tables keep) */
	struct ps_config *ocfg;
	struct ps_server *o;    /* n scratch shards */
	struct stat *base;      /* each one's full file as it was read */
	uint32_t *seq;          /* incremental ones applied to it */
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

#endif
