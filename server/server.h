/* server.h - one ps-server shard: connections, handshake, push/pull/stats.
 *
 * The shard runs on one libuv loop thread. It accepts connections on its
 * configured address, requires a Hello (protocol version, role, rank, shard
 * map hash) before anything else, feeds pushes to the store (store.h),
 * answers pulls when their consistency condition holds, and keeps counters.
 */
#ifndef PS_SERVER_H
#define PS_SERVER_H

#include <stdint.h>
#include <uv.h>
#include "config.h"
#include "shardmap.h"
#include "codec.h"
#include "histo.h"
#include "dedup.h"
#include "store.h"
#include "transport.h"

struct ps_srv_conn;
struct ps_waiting_pull;
struct ps_metrics_http;
struct ps_ckpt_job;
struct ps_repl;
struct ps_srv_rows;
struct ps_members;

struct ps_server_counters {
	uint64_t pushes, pulls, acks, errors, rejected_frames;
	uint64_t auth_failures;    /* handshakes refused for a wrong proof, frames failing their MAC */
	uint64_t duplicate_pushes; /* resent pushes answered without applying them again */
	uint64_t reader_refused;   /* state-changing requests of readers, refused */
	uint64_t bytes_in, bytes_out;
	uint64_t max_clock_gap;    /* largest (pull clock - slowest finished clock) answered */
	uint64_t push_raw[PS_CODEC_COUNT];  /* pushed gradient bytes by codec, as float32 */
	uint64_t push_wire[PS_CODEC_COUNT]; /* and as received (share of the frame after LZ4) */
	uint64_t pull_raw, pull_wire;       /* weights served as float32, and as sent */
	struct ps_histo push_lat, pull_lat; /* arrival to ack / to reply */
};

struct ps_server {
	const struct ps_config *cfg;
	/* A config without a model (cfg->declare): the shard's own copy with
	 * the declared tensors once a worker (or the checkpoint) declared
	 * them, and then cfg points here (declare.c); else NULL. */
	struct ps_config *decl_cfg;
	struct ps_shardmap map;
	struct ps_store store;
	int shard;
	uv_loop_t *loop;
	struct ps_transport *transport;
	struct ps_srv_conn *conns;
	int nconns;
	int nready;               /* connections past the handshake (limits.max_connections) */
	uint64_t evictions;       /* handshakes closed to make room for newer ones */
	int nevicted;             /* of them, not closed yet (still in nconns) */
	struct ps_waiting_pull *waiting;
	uint64_t *finished;        /* per worker rank: clocks finished */
	int *connected;            /* per worker rank: live connections */
	uint8_t *live;             /* per worker rank: counts for barriers and the
				      slowest clock (1 until it has had no connection
				      for limits.drop_timeout_ms, 1 again when it
				      reconnects) */
	double *gone_since;        /* per worker rank: when its last connection
				      closed; 0 while connected or never seen */
	struct ps_server_counters c;
	double started;
	uv_timer_t tick;
	uv_signal_t sigint, sigterm, sigusr1;
	struct ps_metrics_http *http; /* stats.http endpoint, NULL when off */
	uv_timer_t ckpt_timer;        /* checkpoint.every_s */
	char ckpt_path[600];          /* "" when checkpoints are off */
	int exit_status;              /* 1 when the checkpoint on stopping failed */
	/* A live re-shard's stop (stop.c): pushes for stop_at and later are
	 * refused (0: no stop); once committed the shard writes its
	 * checkpoint and exits when every clock below stop_at is closed.
	 * top_clock: one more than the highest clock of a push taken. */
	uint64_t stop_at, top_clock;
	int stop_committed;
	int stop_dirty;               /* changed since the last replication batch */
	/* Re-sharding's bookkeeping (docs/elastic.md, "Operations"): the
	 * incarnation of the monitor that asked the stop (another one is
	 * refused a stop at another clock); the map epoch, the re-shards the
	 * state went through (kept in the checkpoint); what this process's
	 * --reshard-from start took in from other shard indices' files. */
	uint64_t stop_owner;
	/* Per worker rank: the number (Push.seq) of its first push the stop
	 * refused and not taken since, and that process's incarnation (seq 0:
	 * none). Its later pushes wait behind it (stop.c, "order"). */
	struct ps_stop_held {
		uint64_t seq, incarnation;
	} *stop_held;
	uint64_t map_epoch;
	uint64_t reshard_in_bytes, reshard_in_slices, reshard_in_rows;
	/* A pre-copy (SIGUSR1, admin.c): a full checkpoint was asked as the
	 * base staged new shards load while training goes on; the re-shard
	 * stop's checkpoint is then an incremental one on that base. */
	int precopy;
	/* SIGUSR1 came while a checkpoint was being written: the pre-copy's
	 * starts once that one ends (admin.c) */
	int precopy_pending;
	/* A re-shard's start that serves before its first checkpoint of the
	 * new map is written (server.c): this marker in checkpoint.dir names
	 * the old checkpoints, so a restart takes them again; removed once
	 * that checkpoint is written. "" when none. */
	char reshard_marker[620];
	struct ps_ckpt_job *ckpt_job; /* the checkpoint being written, NULL if none */
	double ckpt_last_request;     /* when the last one on request started */
	const char *ckpt_final;       /* a signal came while one was written: its name */
	uint8_t secret[32];           /* hashed cluster secret (security.auth) */
	char replica_refused[240];    /* the last refusal of a partner's Hello, logged once */
	uint8_t repl_key[32];         /* hashed replication key (replicas with security.auth) */
	uint8_t reader_key[32];       /* hashed reader key (security.reader_key_file) */
	int have_reader_key;          /* readers can prove one (else they are refused) */
	struct ps_dedup *dedup;       /* per worker rank: pushes already handled */
	uint64_t boot_id;             /* random per process (HelloReply.boot_id) */
	uint64_t old_place_hash;      /* this config's map hash under placement 0 (before
					 re-sharding): a peer sending it is an older build */
	uint32_t *seen;               /* per slot: the request that last named it */
	uint32_t seen_gen;            /* ... numbered by this counter */
	int replica;                  /* 0: at cluster.servers[shard], 1: at cluster.backups[shard] */
	struct ps_repl *repl;         /* cluster.replicas: 1 (replica.h), else NULL */
	struct ps_srv_rows *rows;     /* embedding tables (rows.h) */
	struct ps_members *members;   /* who counts at which clock (members.h) */
	/* Incremental checkpoints: the full file they build on (valid when
	 * ckpt_have_base), and how many follow it. */
	int ckpt_have_base;
	/* raised when a replication snapshot replaced the tables: a checkpoint
	 * taken before it is no base for incremental ones after it */
	uint64_t tables_gen;
	uint32_t ckpt_base_crc, ckpt_seq;
	uint64_t ckpt_base_len;
	int stopping;
	/* Checkpoint health (Stats, /metrics): when the last one was written
	 * (or loaded at the start; 0 = none), failures since the start. */
	double ckpt_last_ok;
	uint64_t ckpt_failures;
	int ckpt_loaded;              /* started from a checkpoint */
	/* Failed authentications logged (conn.c): at most PS_AUTH_LOG_BURST
	 * lines per PS_AUTH_LOG_WINDOW_S, the rest counted and summed up. */
	double authlog_since;
	int authlog_lines;
	uint64_t authlog_quiet;
	char authlog_last[96];
};

/* Builds the shard's state and starts listening: replica `replica` of
 * the shard (0 listens at cluster.servers[shard]; with cluster.replicas: 1,
 * 1 at cluster.backups[shard]), re-sharding from another number of
 * shards' checkpoints when `from` is set (reshard.h; NULL: a plain start).
 * shard and replica must be the config's (ps-server's main refuses others
 * with its flags' names). Returns 0 or a negative code (the reason is
 * logged). */
struct ps_reshard_from;
int ps_server_init_from(struct ps_server *s, const struct ps_config *cfg, int shard,
			int replica, uv_loop_t *loop, const struct ps_reshard_from *from);

/* Closes every connection and handle; the loop then ends by itself. */
void ps_server_stop(struct ps_server *s);

/* Frees what init allocated; call after the loop has ended. */
void ps_server_free(struct ps_server *s);

#endif
