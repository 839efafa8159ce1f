/* ps_client.h - the client API of the parameter server (libps.so, libps.a).
 *
 * This header and ps_err.h are the whole public API: `pkg-config --cflags
 * --libs ps` finds them and the library. The configuration is opaque here
 * (ps_config_open and the accessors below); programs built inside this tree
 * may include config.h for the full struct.
 *
 * A client connects to every shard of a config as worker `rank` (or as a
 * monitor, rank -1), cuts tensors into slices by the shard map and talks to
 * all shards in parallel from its own I/O thread. Calls return at once with
 * a request id; ps_client_wait(id) blocks until every shard involved has
 * answered. Callable from any thread; the caller holds no locks.
 *
 *   struct ps_client *c;
 *   char err[256];
 *   if (ps_client_init(&c, cfg, rank, err, sizeof(err))) { puts(err); ... }
 *   struct ps_tensor g = { .name = "fc1.weight", .data = grad, .count = n };
 *   int64_t id = ps_client_push(c, clock, &g, 1, PS_PUSH_END_CLOCK);
 *   ps_client_wait(c, id);                      // 0 or a negative PS_E* code
 *   struct ps_tensor w = { .name = "fc1.weight", .data = weights, .count = n };
 *   id = ps_client_pull(c, clock + 1, &w, 1);   // sync: version >= clock + 1
 *   ps_client_wait(c, id);
 *   ps_client_free(c);
 *
 * Memory: the tensor array and the data it points to must stay valid and,
 * for pushes, unchanged until ps_client_wait returns for that id. Every id
 * must be waited for exactly once.
 */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include "ps_err.h"

/* The library's version (also in the soname: libps.so.PS_VERSION_MAJOR). */
#define PS_VERSION_MAJOR 1
#define PS_VERSION_MINOR 0
/* "1.0" as built; compare with PS_VERSION_* to catch a header/library mix. */
const char *ps_version(void);

struct ps_client;
struct ps_config;

/* Reads and validates a YAML config into a new opaque *out. On failure
 * returns PS_ECONFIG (or -errno) and writes "file:line: reason" into err.
 * A config given to ps_client_init must outlive the client. */
int ps_config_open(struct ps_config **out, const char *path, char *err, size_t errlen);
void ps_config_close(struct ps_config *cfg);
/* The model's dense tensors in config order: name and element count. */
int ps_config_ntensors(const struct ps_config *cfg);
const char *ps_config_tensor_name(const struct ps_config *cfg, int i);
int64_t ps_config_tensor_count(const struct ps_config *cfg, int i);
/* The model's embedding tables: name and row width in floats. */
int ps_config_ntables(const struct ps_config *cfg);
const char *ps_config_table_name(const struct ps_config *cfg, int i);
int ps_config_table_dim(const struct ps_config *cfg, int i);
/* Shards, and the consistency mode: 1 sync, 0 async; and the async
 * staleness bound. */
int ps_config_nshards(const struct ps_config *cfg);
/* cluster.workers: the number of worker ranks. */
int ps_config_nworkers(const struct ps_config *cfg);
int ps_config_sync(const struct ps_config *cfg);
int ps_config_staleness(const struct ps_config *cfg);
/* limits.connect_timeout_ms: how long a client waits for the shards to
 * come up (ps-worker and ps.torch.init retry refused connections as long). */
int ps_config_connect_timeout_ms(const struct ps_config *cfg);
/* 1 when the config names no dense model (no model.preset, .layers or
 * .tensors): its workers declare the tensors with ps_client_declare. */
int ps_config_declared(const struct ps_config *cfg);
/* The file the config was loaded from. */
const char *ps_config_path(const struct ps_config *cfg);

struct ps_tensor {
	const char *name;     /* a tensor of the config's model */
	float *data;          /* count floats */
	int64_t count;        /* must equal the tensor's element count */
	uint64_t version;     /* pull: set to the lowest slice version received */
};

/* Tensor i of cfg's model over data (its name and element count). */
struct ps_tensor ps_tensor_of(const struct ps_config *cfg, int i, float *data);

/* Push flags. */
enum {
	/* This push completes the worker's clock: shards advance its clock
	 * (every shard is told, even those that get no slice of this push). */
	PS_PUSH_END_CLOCK = 1u << 0,
	/* push_rows: send the gradients as fp16 (half the bytes) */
	PS_PUSH_ROWS_FP16 = 1u << 1,
	/* pushpull without END_CLOCK: the pull is for the step after this
	 * clock, which a later push of the same pass will end, so async
	 * shards bound its staleness as if the clock had ended (a per-layer
	 * pull gets the same bound as a whole pull after the last push). */
	PS_PULL_AFTER_CLOCK = 1u << 2,
	/* With PS_PUSH_END_CLOCK: this clock is the worker's last, it leaves
	 * the membership from the next one (ps_client_leave). */
	PS_PUSH_LEAVE = 1u << 3,
};

/* One embedding table on one shard (ps_client_stats). */
struct ps_table_stats {
	char name[64];
	unsigned dim;
	uint64_t rows, bytes, admitted, evicted, expired;
	uint64_t cap_rows;         /* rows the shard keeps at most (evicted past it) */
	uint64_t filter_ids, filter_bytes, filter_lookups, filter_hits;
	uint64_t pulled_rows, pushed_rows, version;
	/* FNV-1a of the rows (ids, weights, optimizer state, recency order),
	 * the admission filter and the version: a primary and its backup show
	 * the same (cluster.replicas: 1), and so does a restart from a
	 * checkpoint; 0 in the answers of ps_client_stop_at and of a join or
	 * leave (they read every row) */
	uint64_t checksum;
	/* The instant of the table's stamp 0 (the clock its rows' last-update
	 * stamps and ttl count on) on the shard process's wall clock, seconds
	 * since 1970: a primary and its backup on one host show the same,
	 * after any number of takeovers */
	double epoch_unix;
};
#define PS_STATS_MAX_TABLES 16
/* Latency histogram buckets (the same value as histo.h's). */
#define PS_HISTO_BUCKETS 28

/* Per-shard counters, as returned by ps_client_stats. */
struct ps_shard_stats {
	int shard;
	double uptime_s;
	uint64_t pushes, pulls, bytes_in, bytes_out, applies, errors, rejected_frames;
	uint64_t auth_failures;
	uint64_t duplicate_pushes;
	/* reply bytes queued to every peer now, the most one peer had, the
	 * most all had together, the connections paused by backpressure now */
	uint64_t reply_queue_bytes, reply_queue_peak, reply_queue_total_peak;
	unsigned paused_connections;
	double apply_seconds;
	uint64_t apply_bytes;
	unsigned connections;
	uint64_t max_clock_gap;
	uint64_t param_checksum;
	/* Pushed gradient bytes by codec (index: enum ps_codec_kind in codec.h)
	 * as float32 and as received; pull replies as float32 and as sent. */
	uint64_t push_raw_bytes[8], push_wire_bytes[8];
	uint64_t pull_raw_bytes, pull_wire_bytes;
	/* Latency histograms (histo.h buckets): push arrival to ack, pull
	 * arrival to reply (consistency wait included), and their sums. */
	uint64_t push_lat[PS_HISTO_BUCKETS], pull_lat[PS_HISTO_BUCKETS];
	double push_lat_sum_s, pull_lat_sum_s;
	/* ps_client_checkpoint with write: 0 or a negative code, the file, its
	 * size, the seconds the write took, the reason when it failed. */
	int checkpoint_status;
	char checkpoint_path[600];
	uint64_t checkpoint_bytes;
	double checkpoint_seconds;
	char checkpoint_error[600];
	/* Checkpoint health, when checkpoint.dir is set (checkpoint_on):
	 * seconds since the last checkpoint written (or loaded at the start;
	 * since the start when none was), checkpoints failed since the start,
	 * and checkpoint.every_s (0: periodic ones are off). */
	int checkpoint_on;
	double checkpoint_age_s;
	uint64_t checkpoint_failures;
	unsigned checkpoint_every_s;
	/* cluster.replicas: 1 (server/replica.h): this process's state (0 off,
	 * 1 joining, 2 backup, 3 primary), epoch, partner address, whether the
	 * pair is connected with the state, batches not yet confirmed, its
	 * takeovers, its last batch number, and its replica index. */
	int repl_state;
	uint64_t repl_epoch;
	char repl_partner[320];
	int repl_partner_up;
	uint64_t repl_lag, repl_failovers, repl_lsn;
	int repl_replica;
	int nworkers;
	uint64_t worker_clock[64];    /* the first 64 workers' finished clocks */
	unsigned char worker_up[64];  /* and whether each is connected now */
	int ntables;                  /* embedding tables (the first PS_STATS_MAX_TABLES) */
	struct ps_table_stats tables[PS_STATS_MAX_TABLES];
	/* state-changing requests of readers (PS_RANK_READER), refused */
	uint64_t reader_refused;
	/* Membership (docs/reliability.md): the shard's current clock, the
	 * changes in effect there (epoch), how many workers are members of
	 * it and the first 64 of them, joins and leaves since the start. */
	uint64_t member_current, member_epoch, joins, leaves;
	int nmembers;
	int members[64];
	/* the answer to a join step (ps_client_join): 0, 1 (a member
	 * already) or a negative code with the reason; the clock named */
	int member_status;
	uint64_t member_clock;
	char member_error[300];
	/* cluster.replicas: 1: the primary's batches sent to its backup
	 * (heartbeats apart), their payload bytes, its heartbeats; a backup's
	 * batches applied, their bytes, heartbeats received */
	uint64_t repl_batches, repl_bytes, repl_heartbeats;
	/* the first 64 workers' dedup windows: the highest push number marked
	 * and a digest of the window (equal on a primary and its backup) */
	uint64_t dedup_seq[64], dedup_digest[64];
	/* a live re-shard's stop (ps_client_stop_at): the clock the shard
	 * stops at (0: none), whether that was committed, and one more than
	 * the highest clock of a push it took */
	uint64_t stop_at, top_clock;
	int stop_committed;
	/* Re-sharding (docs/elastic.md, "Operations"): the map epoch (the
	 * re-shards the shard's state went through, kept in its checkpoint);
	 * what its --reshard-from start took in from other shard indices'
	 * files (bytes of weights, optimizer state and rows; slices; rows).
	 * Membership changes under way: the workers whose join holds a clock
	 * there (the first 16) with the clock they join at the earliest, and
	 * those leaving (async) with the clock they are counted at. */
	uint64_t map_epoch, reshard_in_bytes, reshard_in_slices, reshard_in_rows;
	int njoining, nleaving;
	int joining[16], leaving[16];
	uint64_t joining_clock[16], leaving_clock[16];
	/* What the workers declared at run time: a digest of the declared
	 * tensors and tables (0: none; equal on shards holding the same
	 * declarations), the tensors' count and the tables'. A monitor of its
	 * own commits a stop only when every shard's answer to it has the
	 * same digest (docs/elastic.md) */
	uint64_t decl_digest;
	int decl_tensors, decl_tables;
};

/* The rank of a reader: a read-only client that proves the reader key
 * (security.reader_key_file or $PS_READER_KEY_FILE) instead of the cluster
 * secret. It may pull tensors and rows and read stats; the shards refuse
 * its pushes, row pushes, declarations and checkpoint requests with
 * PS_EREFUSED ("a reader may only pull: push refused") and change
 * nothing. It is not a worker: no clock, no barrier waits for it. Like a
 * worker's, its init fails when a shard cannot be reached or refuses it;
 * unlike a worker it does not reconnect: after a shard restarts, its
 * requests fail (PS_ECLOSED) and a new client is made. */
#define PS_RANK_READER (-2)

/* Connects to every shard and completes the handshakes (within
 * limits.connect_timeout_ms). A worker or reader first waits, for up to
 * limits.connect_timeout_ms as well, until every shard's host name
 * resolves (servers named by DNS names that appear only once their
 * process starts, as a Kubernetes StatefulSet's pods), logging what it
 * waits for; then PS_ERESOLVE names the shard. rank is the worker rank, -1 for a monitor
 * that only reads statistics, or PS_RANK_READER: a monitor's init succeeds
 * even when shards are unreachable (see ps_client_shard_error). On failure returns a negative code and writes
 * the reason (naming the shard and, for a refused handshake, both sides'
 * values) into err. cfg must outlive the client. A worker whose
 * environment has PS_CONFIG_FOLLOW=FILE (FILE: one line, the path of the
 * cluster's current config) follows a re-shard while it runs: once every
 * shard is lost and FILE names a config differing in cluster.servers
 * only, it takes that config's map and sends its waiting pushes and pulls,
 * dense and rows, again to the new shards (docs/elastic.md;
 * ps_client_follow.c); a call with another request in flight starts it
 * again on the new map: a declaration goes to every new shard, a stats or
 * checkpoint request to the new shard of the same index (PS_EMAP when the
 * new map has no such shard: ask again), a join or leave from the first
 * new shard. */
int ps_client_init(struct ps_client **out, const struct ps_config *cfg, int rank, char *err,
		   size_t errlen);

/* 1 when a shard this worker connected to had started from a checkpoint
 * (else the shards' clock, ps_client_clock, is where they went on from an
 * earlier run of the workers, or 0). */
int ps_client_from_checkpoint(struct ps_client *c);

/* Closes every connection, fails requests still in flight, frees c. */
void ps_client_free(struct ps_client *c);

/* Pushes gradients for clock. Returns a request id (> 0) or a negative code
 * (unknown tensor, wrong count, client failed). */
int64_t ps_client_push(struct ps_client *c, uint64_t clock, const struct ps_tensor *t, int n,
		       unsigned flags);

/* Pulls weights into t[i].data. Sync: answered once every slice has version
 * >= min_version (clocks applied). Async: answered once the slowest worker
 * has finished the caller's clock minus the staleness. */
int64_t ps_client_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t, int n);

/* A push and a pull in one go (ps-lite's PushPull): the same as
 * ps_client_push(c, clock, grad, ngrad, flags) followed by
 * ps_client_pull(c, min_version, out, nout), except that each shard gets
 * both frames in one write, reads them together and answers both in one
 * write: one system call instead of two on the way out, and the shard
 * never wakes for the push alone (BENCHMARKS.md: the 4 KiB round trip).
 * ids[0] is the push's request id, ids[1] the pull's;
 * wait for both. The two tensor sets must not overlap (the pull writes
 * into out while the push may still be reading grad). Returns 0 or a
 * negative code (then neither was sent). */
int ps_client_pushpull(struct ps_client *c, uint64_t clock, const struct ps_tensor *grad,
		       int ngrad, unsigned flags, uint64_t min_version, struct ps_tensor *out,
		       int nout, int64_t ids[2]);

/* Embedding tables (model.embeddings; docs/embeddings.md).
 *
 * Pulls the rows of ids[0..n) of table into out (n * dim floats, row i at
 * out + i * dim). Ids may repeat; each distinct id is asked for once, from
 * the shard its (table, id) hash names, sorted and delta-varint coded. A
 * row that does not exist reads as its initial value. Sync: answered once
 * the table's version on each shard is >= min_version (clocks applied);
 * async: once the slowest worker has finished the caller's clock minus
 * the staleness. Returns a request id (> 0) for ps_client_wait, or a
 * negative code: PS_ENOTENSOR (unknown table), PS_ETOOBIG (more distinct
 * ids for one shard than limits.max_request_rows). out must stay valid
 * until the wait returns. */
int64_t ps_client_pull_rows_async(struct ps_client *c, const char *table, uint64_t min_version,
				  const uint64_t *ids, size_t n, float *out);
int ps_client_pull_rows(struct ps_client *c, const char *table, uint64_t min_version,
			const uint64_t *ids, size_t n, float *out);

/* Pushes row gradients (n * dim floats, row i for ids[i]) for clock. The
 * gradients of repeated ids are summed here (in input order) and each
 * distinct id is sent once, to its shard. Sync: every shard gets a frame
 * (with no ids when none of them are its own), and each worker pushes a
 * table at most once per clock: a clock of the table is applied once every
 * live worker pushed it or ended it. Push rows before the dense push that
 * ends the clock. Flags: PS_PUSH_ROWS_FP16. grads is copied before the
 * call returns. Returns a request id, or a negative code as pull_rows. */
int64_t ps_client_push_rows_async(struct ps_client *c, const char *table, uint64_t clock,
				  const uint64_t *ids, size_t n, const float *grads,
				  unsigned flags);
int ps_client_push_rows(struct ps_client *c, const char *table, uint64_t clock,
			const uint64_t *ids, size_t n, const float *grads, unsigned flags);

/* Bytes row requests sent so far: ids and values as the caller gave them
 * (8 bytes an id, 4 a value), and as sent after deduplication and coding. */
void ps_client_rows_bytes(struct ps_client *c, uint64_t *given, uint64_t *sent);

/* Blocks until request id completes; returns 0 or its negative code. */
int ps_client_wait(struct ps_client *c, int64_t id);

/* ps_client_wait with a limit: PS_ETIMEDOUT when id has not completed
 * within timeout_s seconds (id then stays pending: wait for it again),
 * else what ps_client_wait returns. */
int ps_client_wait_timeout(struct ps_client *c, int64_t id, double timeout_s);

/* 1 when request id has completed (ps_client_wait will not block), 0 when
 * it is still in flight, -EINVAL when it is not pending on c. */
int ps_client_done(struct ps_client *c, int64_t id);

/* Text of the last failure seen by ps_client_wait or a call on this client. */
const char *ps_client_error(struct ps_client *c);

/* Asks shard for its counters (blocking).
 *
 * struct ps_shard_stats grows at its end from one release of libps.so.1 to
 * the next, so these two are macros that pass the size of the struct the
 * program was built with to the _sized calls: the program gets the fields
 * it knows, and never a write past its struct when the library is newer
 * than its header. (The plain functions of the same names stay exported
 * for programs built before the macros: they fill the library's whole
 * struct.) */
#define ps_client_stats(c, shard, out) ps_client_stats_sized((c), (shard), (out), sizeof(*(out)))
int ps_client_stats_sized(struct ps_client *c, int shard, struct ps_shard_stats *out, size_t size);

/* Same as ps_client_stats; with write nonzero the shard first writes its
 * checkpoint (config checkpoint.dir) and reports the outcome in
 * out->checkpoint_*. Returns the request's status (a failed write is not a
 * failed request: look at out->checkpoint_status). */
#define ps_client_checkpoint(c, shard, write, out) \
	ps_client_checkpoint_sized((c), (shard), (write), (out), sizeof(*(out)))
int ps_client_checkpoint_sized(struct ps_client *c, int shard, int write,
			       struct ps_shard_stats *out, size_t size);
/* the plain functions (a call through them fills sizeof the library's struct) */
int (ps_client_stats)(struct ps_client *c, int shard, struct ps_shard_stats *out);
int (ps_client_checkpoint)(struct ps_client *c, int shard, int write, struct ps_shard_stats *out);

/* A live re-shard's stop (monitors only, rank -1; docs/elastic.md): asks
 * shard to refuse every push for clock and later (the workers' client
 * keeps such a push and sends it again on the new map), with
 * PS_STOP_COMMIT also to write its checkpoint and exit once every clock
 * below is closed; PS_STOP_CANCEL (clock ignored) takes pushes again
 * before a commit. out as ps_client_stats. PS_ECLOCK when the shard took
 * a push for clock or later already (out is then not filled: ask again
 * with a later clock); the reason in ps_client_error. */
#define PS_STOP_COMMIT 1u
#define PS_STOP_CANCEL 2u
/* (out's size goes with it, as the program was built: the library fills
 * the fields both know and zeroes the rest) */
#define ps_client_stop_at(c, shard, clock, flags, out) \
	ps_client_stop_at_sized((c), (shard), (clock), (flags), (out), sizeof(*(out)))
int ps_client_stop_at_sized(struct ps_client *c, int shard, uint64_t clock, unsigned flags,
			    struct ps_shard_stats *out, size_t size);

/* NULL when shard is connected; else why not (copied into buf, len bytes).
 * Useful for monitors (rank -1), whose init succeeds with shards down. */
const char *ps_client_shard_error(struct ps_client *c, int shard, char *buf, size_t len);

/* Gradient bytes this client has pushed: as float32 (raw) and as sent after
 * the codecs and LZ4 (wire). Call from the pushing thread. */
void ps_client_push_bytes(struct ps_client *c, uint64_t *raw, uint64_t *wire);

/* The clock this client sends with pulls: clocks finished by its pushes,
 * or after connecting, the clock the shards continue from (more than 0
 * when they resumed from a checkpoint: a worker starts its steps there). */
uint64_t ps_client_clock(struct ps_client *c);

/* Elastic membership (cluster.initial_workers; docs/reliability.md).
 *
 * Makes this worker a member of the running cluster from a clock every
 * shard agrees on: each shard holds its first open clock for it, then all
 * are told the largest plus one (async: plus consistency.staleness more,
 * past every clock a worker may have started), and ps_client_clock()
 * becomes that clock
 * (pull it, then push it). In an elastic cluster (cluster.initial_workers
 * below cluster.workers) ps_client_init calls it for every worker, so a
 * rank that is not a member joins by starting; ps-worker calls it in any
 * cluster (a rank that left comes back). For a member already it does
 * nothing but start ps_client_clock() at its join clock. 0 or a negative
 * code (PS_EREFUSED with the shard's reason, e.g. when half a join
 * survived a crash and a shard passed its clock; reason in
 * ps_client_error). Under cluster.replicas: 1 each step is answered once
 * the shard's backup has it, so a failover between the steps loses
 * neither. While a re-shard's stop is pending on a shard (docs/elastic.md,
 * "Operations") the join waits: asked again every 0.2 s for up to
 * limits.reconnect_timeout_ms, then PS_ERESHARD; ps_client_leave_begin
 * (async) the same. A join or leave the client's following of a re-shard
 * ($PS_CONFIG_FOLLOW) interrupts starts again on the new map, within that
 * time too. */
int ps_client_join(struct ps_client *c);

/* Ends clock (the worker's last; what it pushed for it counts) and leaves:
 * no barrier waits for this worker from clock + 1 on, at once (no drop
 * timeout). The same as ps_client_push(c, clock, NULL, 0,
 * PS_PUSH_END_CLOCK | PS_PUSH_LEAVE) and waiting for it. Later pushes are
 * refused until ps_client_join. 0 or a negative code. ps_client_join,
 * ps_client_leave and ps_client_leave_begin of a monitor: -EINVAL (the
 * reason in ps_client_error). */
int ps_client_leave(struct ps_client *c, uint64_t clock);

/* Starts a leave whose data division stays exact (docs/reliability.md,
 * "Data"): *last becomes the clock this worker must still train (push it
 * with PS_PUSH_END_CLOCK | PS_PUSH_LEAVE; the clocks before it as usual).
 * Sync, or async with consistency.staleness 0: the current clock
 * (ps_client_clock), nothing asked of the shards. Async with staleness s:
 * *last is the highest clock any shard may have told a worker with this
 * one as a member (at least the current clock: at most as far as the
 * fastest worker got), and no shard tells another worker a later clock
 * until this worker's push of *last leaves (or it is dropped, or another
 * process of its rank connects): train through it; the others wait
 * there. (A worker that only calls ps_client_leave leaves at once, and
 * with s > 0 the others may have been told up to s clocks with it as a
 * member.) 0 or a negative code (the reason in ps_client_error). */
int ps_client_leave_begin(struct ps_client *c, uint64_t *last);

/* The membership of a clock, as the last pull reply told it. */
struct ps_members_info {
	uint64_t clock;   /* the clock it is for (the one the worker computes next) */
	uint64_t epoch;   /* membership changes in effect at that clock */
	uint64_t before;  /* sum over clocks 0..clock-1 of each clock's member count */
	int count;        /* members of that clock */
	int index;        /* this worker's place among them (ascending ranks), -1 if none */
};

/* Fills out from the latest pull reply (a fixed cluster that never
 * changed: count cluster.workers, index the rank, before clock times the
 * count). A data loader takes batch slot before + index of clock's
 * before..before+count-1 (ps-worker does): over any run of clocks every
 * slot is taken once, whoever joined or left. 0 or -EINVAL (not a worker;
 * the reason in ps_client_error). */
int ps_client_members(struct ps_client *c, struct ps_members_info *out);

/* Tensors declared at run time (a config without a model; docs/python.md,
 * docs/protocol.md). One parameter of the model: */
struct ps_param {
	const char *name;      /* unique, 1..63 bytes */
	int ndims;             /* 0..8 (0: a scalar) */
	const int64_t *dims;   /* ndims sizes, each >= 1 */
	float *data;           /* product of dims floats: rank 0's initial values
				  in; the shards' values out */
};

/* Declares the model's dense tensors p[0..n) (n <= 8192), in the model's
 * order: every worker must declare the same names and shapes in the same
 * order, from which each derives the same shard map. The first declaration
 * the shards accept is rank 0's, and creates the tensors with the values in
 * its p[i].data; other ranks wait for it (up to limits.request_timeout_ms).
 * A declaration that differs from the shards' tensors (a name or a shape;
 * a worker restarted with another model) is refused with PS_ECONFIG and
 * ps_client_error naming the first difference and both lists. On success
 * every p[i].data is overwritten with the shards' current values (rank 0's
 * initial values in a new run; the trained weights after a restart of the
 * worker or of the cluster from checkpoints), and the tensors are known
 * by name to push and pull (ps_client_config). Call once, after init and
 * before any push or pull, as a worker (rank >= 0); when the declaration
 * was made but pulling the values failed (ps_client_error says so), the
 * same call again only pulls them. Returns 0 or a negative code:
 * PS_ECONFIG (the config names its model, or the declaration differs),
 * PS_ESTATE (declared already, or a monitor),
 * PS_ETOOBIG / -EINVAL (a bad list: the reason in ps_client_error),
 * PS_ETIMEDOUT (rank 0 never declared). */
int ps_client_declare(struct ps_client *c, const struct ps_param *p, int n);

/* One optimizer group of declared tensors (a torch param_group), with
 * PyTorch's meanings (docs/python.md). */
struct ps_optim_group {
	const char *kind;        /* "sgd", "adam", "adamw", "adagrad", "reduce" */
	float lr;                /* initial learning rate (ps_client_set_lr changes it per step) */
	float momentum, dampening; int nesterov;     /* sgd (momentum 0: plain sgd) */
	float beta1, beta2, eps;                      /* adam, adamw; eps also adagrad */
	float weight_decay;      /* sgd/adam/adagrad: L2 added to the gradient (torch); adamw:
				    decoupled, w *= 1 - lr*wd first */
	float lr_decay, initial_accumulator;         /* adagrad (torch's lr_decay,
							initial_accumulator_value) */
	int average;             /* sync: apply the MEAN of the gradients pushed for a clock (sum
				    / how many workers pushed it), not their sum; async: each
				    gradient scaled by 1/nworkers */
};

/* ps_client_declare with optimizer groups: groups[0..ngroups) (1..64),
 * group_of[i] the group of p[i]. The shards update each tensor by its
 * group's rule instead of the config's optimizer section; "reduce" makes
 * a tensor's value the clock's (averaged) gradient, sync mode only. The
 * groups (every field but lr) and group_of are part of the declaration: a
 * worker whose groups differ from the shards' is refused with PS_ECONFIG
 * naming the group or tensor, the field and both values. Settings outside
 * torch's valid ranges, an unknown kind or a group_of out of range:
 * PS_ECONFIG / -EINVAL before anything is sent. Otherwise as
 * ps_client_declare. */
int ps_client_declare_groups(struct ps_client *c, const struct ps_param *p, int n,
			     const struct ps_optim_group *groups, int ngroups, const int *group_of);

/* The learning rate group's tensors get from this client's next pushes on
 * (an LR schedule's value each step; every push carries every group's
 * rate; in sync mode a clock's update uses the rates of the lowest rank
 * that pushed it). 0 or -EINVAL (no such group, lr not finite or < 0). */
int ps_client_set_lr(struct ps_client *c, int group, float lr);

/* An embedding table declared at run time (docs/embeddings.md): the keys
 * of a model.embeddings entry, with its defaults, bounds and rules. A zero
 * or NULL field takes that key's default (init uniform with scale 0.01,
 * optimizer rowwise_adagrad, lr 0.01, eps 1e-8, beta1 0.9, beta2 0.999,
 * ftrl_beta 1; the others 0). */
struct ps_table_decl {
	const char *name;        /* 1..63 bytes, not a table of the config */
	unsigned dim;            /* floats per row, 1..4096 */
	const char *init;        /* "zeros", "const", "uniform", "normal" */
	float init_value;        /* const: the value; uniform/normal: the scale */
	const char *optimizer;   /* "sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl" */
	float lr, eps, beta1, beta2, initial_accumulator, l1, l2, ftrl_beta; /* as model.embeddings */
	uint32_t admission;      /* 0: every row at once */
	uint64_t ttl_s;          /* 0: never expire */
	uint64_t max_rows;       /* 0: no cap beyond limits.max_table_bytes */
};

/* Declares embedding tables t[0..n) beside the config's model.embeddings
 * (with or without declared tensors, before or after them). As with
 * ps_client_declare: rank 0's declaration creates the tables on every
 * shard, other ranks wait for it (up to limits.request_timeout_ms) and
 * must declare the same list (else PS_ECONFIG naming the table, the field
 * and both values); a restarted worker re-declares and is acked, and a
 * shard restarted from its checkpoint has the tables (and rows) back. On
 * success the tables are known by name to ps_client_pull_rows and
 * ps_client_push_rows and listed by ps_client_config (ps_config_ntables).
 * Call once, as a worker. Returns 0 or a negative code: PS_ECONFIG (a
 * value out of model.embeddings[]'s bounds, an unknown init or optimizer,
 * a name of the config's tables or twice, or the declaration differs;
 * under cluster.replicas: 1 the backup holds them too), PS_ETOOBIG (n < 1, or more than 64 tables with
 * the config's), PS_ESTATE (declared already, or a monitor), PS_ETIMEDOUT
 * (rank 0 never declared); the reason in ps_client_error. */
int ps_client_declare_tables(struct ps_client *c, const struct ps_table_decl *t, int n);

/* The config the client works with: the one given to init, or after
 * ps_client_declare / ps_client_declare_tables its copy with the declared
 * tensors and tables (ps_config_ntensors, ps_tensor_of and
 * ps_config_ntables see them). Valid until ps_client_free. */
const struct ps_config *ps_client_config(struct ps_client *c);

#endif
