/* reshard.h - a shard that starts with another number of shards than the
 * checkpoints it resumes from were made for (docs/elastic.md, "Re-sharding
 * by restart").
 *
 * The old cluster's checkpoints (shard-0.ckpt .. shard-(N-1).ckpt, their
 * incremental ones and membership files) lie in a folder of their own,
 * which nothing writes to; each new shard loads every one of them in turn
 * (one at a time, as a shard of the old map would, with all its checks)
 * and keeps what it owns under its own map: the dense slices with their
 * optimizer state, version and step count; the embedding rows its hash
 * names, with their optimizer state, in the order of their last update
 * (the rows of several old shards merged by time); the admission filters'
 * counts; the tables' versions; the workers' finished clocks; the
 * tensors and tables declared at run time; the membership. What is not
 * carried: the per-worker dedup windows (never in a checkpoint: workers
 * reconnect to a restarted shard as new incarnations and resend what was
 * not acknowledged) and the tables' monitoring counters of old shards
 * that are not this one (admitted, evicted, expired, filter lookups).
 *
 * Old checkpoints of either placement (shardmap.h) load: the one before
 * re-sharding is re-placed as another shard count is.
 *
 * With cluster.replicas: 1 both processes of every new pair load them,
 * each writing its own file (shard-K.ckpt, shard-K-r1.ckpt), and of each
 * old pair the file of the newer state is read: both processes wrote one
 * when the pair was whole at the stop, a process that was down an older
 * one or none.
 */
#ifndef PS_RESHARD_H
#define PS_RESHARD_H

#include <stddef.h>

struct ps_server;

/* Where the old checkpoints are: ps-server --reshard-from DIR --reshard-shards N. */
struct ps_reshard_from {
	const char *dir;
	int nshards;
	/* --reshard-stage PID: a pre-copy (docs/elastic.md): the old
	 * shards' files are loaded from checkpoint.dir while they run, then
	 * the shard waits for SIGUSR1 (the launcher's commit) and applies the
	 * stop's incremental checkpoints from dir. PID: the launcher, this
	 * process's parent, with which it ends. 0: not staged. */
	long stage;
};

/* Loads into s (set up, not serving, with checkpoint.dir; its own
 * checkpoint absent or of another map) what it owns of from's
 * checkpoints. 0, or a negative code with the reason in err naming the
 * file: one missing, damaged or of another model, files of different
 * clocks, from->dir being checkpoint.dir itself. On an error s holds a
 * part of the state: the caller does not serve it. Staged (from->stage),
 * it waits for the commit in between (SIGUSR1; SIGTERM, SIGINT, its
 * launcher's end or 600 s without one end it with -ECANCELED). */
int ps__reshard_load(struct ps_server *s, const struct ps_reshard_from *from, char *err,
		     size_t errlen);

/* A re-shard's start serves before its first checkpoint of the new map
 * is written (in the background): until then CKPT_DIR/shard-K.reshard
 * ("N DIR": the old shard count and the folder of their files) says so,
 * and a start without --reshard-from that finds it takes DIR again (the
 * same state). marker_path: its name; marker_write: written and fsynced
 * (s->reshard_marker set: the first full checkpoint removes it), 0 or a
 * negative code with err; marker_read: 1 when there is one (from set,
 * its folder in dirbuf, s->reshard_marker set), 0 when none, or a
 * negative code with err (damaged). */
void ps__reshard_marker_path(const struct ps_server *s, char *buf, size_t len);
int ps__reshard_marker_write(struct ps_server *s, const struct ps_reshard_from *from,
			     char *err, size_t errlen);
int ps__reshard_marker_read(struct ps_server *s, struct ps_reshard_from *from, char *dirbuf,
			    size_t dirlen, char *err, size_t errlen);

#endif
