/* ps_client_int.h - what the client library's files share (not a public
 * API; worker/ps_client.h is).
 *
 * The calling thread builds each request completely (slices grouped per
 * shard, metadata packed, payload pieces pointing into the caller's tensors)
 * and queues it; the I/O thread, woken by a uv_async_t, only hands frames to
 * the transport and matches replies to requests by id. One mutex guards the
 * request list and the client's state; completions broadcast one condvar.
 *
 *   ps_client.c        life cycle (init, free) and the I/O thread's loop:
 *                      sending what is queued, the periodic tick
 *   ps_client_conn.c   one connection per shard: handshake, frames in,
 *                      heartbeats, reconnect with backoff and resend
 *   ps_client_req.c    requests and their completion, the public calls
 *   ps_client_build.c  building a request: slices, codecs, LZ4, metadata
 */
#ifndef PS_CLIENT_INT_H
#define PS_CLIENT_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "auth.h"
#include "config.h"
#include "config_agree.h"
#include "histo.h"
#include "msg.h"
#include "ps_client.h"
#include "shardmap.h"

enum req_kind { REQ_PUSH, REQ_PULL, REQ_STATS, REQ_PULL_ROWS, REQ_PUSH_ROWS, REQ_DECLARE,
		REQ_DECLARE_TABLES };
struct rows_req;
enum shard_state { SH_CONNECTING, SH_HELLO, SH_READY, SH_FAILED, SH_RETRY };

struct part {               /* what one request sends to one shard */
	uint8_t *meta;
	uint32_t meta_len;
	int niov;
	struct ps_iov *iov;
	uint8_t *enc;           /* push: encoded slices (codecs), then LZ4 output */
	unsigned frame_flags;   /* PS_FRAME_F_* of the frame */
	int waiting;            /* reply still expected from this shard */
	unsigned gen;           /* connection generation it was sent on; 0 = not yet */
};

struct req {
	int64_t id;
	enum req_kind kind;
	int pending;            /* shards still to answer */
	int status;
	char *why;              /* the first failure's text (malloc'ed), given to c->err
				 * by ps_client_wait in the waiting thread: the I/O
				 * thread never writes c->err under a caller reading it */
	int done;
	int queued;             /* not yet handed to the I/O thread */
	double deadline;
	struct ps_tensor *t;    /* pull: the caller's tensors */
	int n;
	int *tidx;              /* pull: config tensor index of t[i] */
	struct ps_shard_stats *stats;
	uint64_t clock;         /* push: its clock, and whether it ends it */
	int end_clock;
	struct rows_req *rows;  /* pull_rows: where each shard's rows go (ps_client_rows.c) */
	/* What a re-shard needs to cut the request again for the new map
	 * (ps_client_follow.c): a push's tensors (the caller's, valid until
	 * the wait) and flags; a pull's min_version and clock. */
	const struct ps_tensor *pt;
	unsigned push_flags;
	uint64_t min_version, pull_clock;
	int recut;              /* cut again by a re-shard (ps_client_follow.c) */
	struct req *next;
	struct req *send_next;  /* queue of requests for the I/O thread to send */
	int nparts;             /* == c->cfg->nshards for every request in c->reqs */
	struct part *parts;     /* one per shard */
};

struct shard_conn {
	struct ps_conn *conn;
	double last_rx, last_hb;  /* I/O thread: last frame from the shard, last heartbeat sent */
	enum shard_state state;
	int status;
	int authed;               /* the shard proved it holds the secret */
	unsigned gen;             /* connections that reached ready so far */
	double lost_at;           /* reconnecting since (0 = not) */
	double retry_at, backoff; /* SH_RETRY: next attempt, and the delay after it */
	double attempt_at;        /* when the current reconnect attempt started */
	uint64_t boot_id;         /* the shard process's, from its HelloReply */
	int alt;                  /* cluster.replicas: 1: dialing cluster.backups[k], not servers[k] */
	uint64_t epoch;           /* the shard's takeovers, from its HelloReply */
	uint64_t done_clock;      /* clocks whose ending push this shard acknowledged */
	double stop_retry_at;     /* a push refused with PS_ERESHARD: resend then (0 = none) */
	double stop_retry_gap;    /* its wait: 0.1 s, doubled per refusal up to 1 s; 0 after an ack */
	uint64_t hello_clock;     /* its HelloReply: clock, fresh, from_checkpoint */
	int fresh, from_ckpt;
	uint8_t *hello;           /* the Hello as sent (the transcript covers it) */
	size_t hello_len;
	char why[600];
	/* While reconnecting: the last answer that would have ended the
	 * handshake but came from a peer that had not proven the secret
	 * (escaped), named if the reconnects time out; "" when none. */
	char untrusted[300];
	/* The shard's last word on a pull it holds (a heartbeat reply's
	 * held: the workers it waits for), and when it came; "" when none. */
	char held[300];
	double held_at;
};

struct deferred {           /* a frame ps__client_take() leaves to the I/O thread */
	struct deferred *next;
	struct ps_frame *f;
	int k;
	unsigned gen;           /* the connection it came on (shard_conn.gen) */
};

struct ps_client {
	const struct ps_config *cfg;
	/* After ps_client_declare: the client's own copy of the config with
	 * the declared tensors (cfg then points here); else NULL. */
	struct ps_config *own_cfg;
	/* A copy replaced by a later declaration when the list of retired
	 * configs could not grow (ps__client_retire_cfg): kept, as other
	 * threads may still read it, until ps_client_free. */
	struct ps_config *old_cfg;
	int declared_tensors, declared_tables;
	int declared_unpulled; /* declared, but the pull that ends the call failed */
	/* Declared with optimizer groups (own_cfg->ngroups of them): the
	 * learning rate of each that every push carries (ps_client_set_lr;
	 * under mu). */
	float group_lr[PS_MAX_GROUPS];
	struct ps_shardmap map;
	int rank;
	uint64_t clock;
	uv_loop_t loop;
	uv_async_t wake;
	uv_timer_t tick;
	pthread_t thread;
	struct ps_transport *transport;
	struct shard_conn *shards;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct req *reqs;       /* every request not yet waited for */
	/* Requests submitted and not yet sent, oldest first: frames must leave
	 * in submission order (a sync shard expects clock c before c + 1, and a
	 * worker's last push of a clock ends it). */
	struct req *sendq_head, *sendq_tail;
	/* Frames read by a waiting thread that only the I/O thread may handle,
	 * oldest first. */
	struct deferred *deferred, **deferred_tail;
	/* Push compression: per tensor, the error-feedback residual (NULL until
	 * first used, only for codecs with error feedback); bytes pushed as
	 * float32 and as sent. Touched by the pushing thread only. */
	float **resid;
	uint64_t push_raw, push_wire;
	uint64_t rows_given, rows_sent; /* row requests: bytes as given, as sent (c->mu) */
	int64_t next_id;
	double spin_s;          /* ps_client_wait spins this long before sleeping */
	int sleepers;           /* threads blocked in pthread_cond_wait on cv */
	int stopping;
	int started;            /* init succeeded: losses are worth a log line */
	int nready, nfailed;
	uint8_t secret[PS_AUTH_KEY_LEN]; /* hashed cluster secret (security.auth) */
	uint64_t incarnation;   /* random per client, the same across reconnects */
	char settings[PS_AGREE_MAX]; /* Hello.settings as sent (config_agree.h) */
	char settings_plain[PS_AGREE_MAX]; /* ... and their values */
	char err[512];
	/* The membership the last pull reply told (PullReply.has_members;
	 * under mu): for clock mem_clock, the latest seen. */
	int mem_have;
	uint64_t mem_clock, mem_epoch, mem_before;
	int mem_count, mem_index;
	/* Following a live re-shard (ps_client_follow.c; workers with
	 * $PS_CONFIG_FOLLOW): the pointer file, the config path it named
	 * last and that file's mtime, the config as first loaded from a
	 * file (what a new one may differ from in cluster.servers only),
	 * the configs replaced (kept until ps_client_free: other threads may
	 * still read them), what was last refused (logged once), the
	 * re-shards followed. maplock: readers build pushes and pulls,
	 * the I/O thread writes when it changes the map. */
	pthread_rwlock_t maplock;
	char *follow_path;
	char follow_cur[1024];
	int64_t follow_mtime_ns;
	struct ps_config *file_cfg;
	struct ps_config **retired;
	int nretired;
	char follow_refused[1200];
	uint64_t reshards;
};

/* ps_client_declare.c: sends a declaration to every shard of the map of
 * re-shard count gen (send returns the request id for shard k, or a
 * negative code; each is built and submitted under maplock) and waits for
 * each; a shard that answers -EAGAIN (rank 0 has not declared yet) or
 * PS_ERESHARD (it holds a re-shard's stop) is asked again every 20 ms,
 * up to limits.request_timeout_ms (then
 * PS_ETIMEDOUT). 0, the first refusal's code with the reason in why, or
 * PS__AGAIN_ON_NEW_MAP when the client followed a re-shard meanwhile
 * (c->reshards is past gen): the caller builds the declaration again for
 * the new map and sends it to every new shard. Tensors and tables. */
#define PS__AGAIN_ON_NEW_MAP 1
int ps__client_declare_all(struct ps_client *c, uint64_t gen,
			   int64_t (*send)(struct ps_client *c, void *arg, int k), void *arg,
			   char *why, size_t whylen);
/* ps_client_follow.c: a request the client's following of a re-shard
 * interrupted (gen, the re-shard count when it began, is behind; what
 * names it in the log): 1 to start it again on the new map, for up to
 * limits.reconnect_timeout_ms from the first time (*since, 0 before it);
 * 0 when no re-shard came between, or that time is up. */
int ps__client_again_on_new_map(struct ps_client *c, const char *what, uint64_t gen,
				double *since);
/* c->reshards, read under c->mu. */
uint64_t ps__client_reshards(struct ps_client *c);

/* ps_client_req.c: a StatsRequest with resume_clock to shard k (proto
 * StatsRequest), waited for; 0 or a negative code. */
int ps__client_resume(struct ps_client *c, int k, uint64_t clock);

/* ps_client_follow.c: a live re-shard. init: reads $PS_CONFIG_FOLLOW
 * (workers); 0 or a negative code with err. tick (I/O thread, c->mu not
 * held): when every shard is lost and the pointer file names another
 * config differing in cluster.servers only, the client takes its map,
 * connections and every request waiting, cut again for the new map.
 * free: what init and the switches kept. */
int ps__client_follow_init(struct ps_client *c, char *err, size_t errlen);
void ps__client_follow_tick(struct ps_client *c);
void ps__client_follow_free(struct ps_client *c);
void ps__client_retire_cfg(struct ps_client *c, struct ps_config *old);
/* The first line where the two configs' dumps differ, into key; 0 when
 * none does; 1 with key "(out of memory)" when they could not be made. */
int ps__client_config_diff(const struct ps_config *a, const struct ps_config *b, char *key,
			   size_t len);

/* ps_client_members.c: a pull reply's membership noted (under c->mu). */
void ps__client_note_members(struct ps_client *c, const Ps__PullReply *m);

/* ps_client_req.c: requests and their completion */
void ps__client_set_err(struct ps_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
struct req *ps__client_req_new(struct ps_client *c, enum req_kind kind);
void ps__client_req_free(struct ps_client *c, struct req *r);
struct req *ps__client_find_req(struct ps_client *c, int64_t id);
void ps__client_part_done(struct ps_client *c, struct req *r, int shard, int status,
			  const char *why);
void ps__client_fail_shard_reqs(struct ps_client *c, int k, int status, const char *why);
void ps__client_on_pull_reply(struct ps_client *c, int k, const Ps__PullReply *m,
			      const struct ps_frame *f);
void ps__client_on_stats_reply(struct ps_client *c, int k, const Ps__Stats *m);
int ps__client_send_part(struct ps_client *c, struct req *r, int k);
/* Submits r built with code rc: its id, or the negative code. */
int64_t ps__client_submit_built(struct ps_client *c, int rc, struct req *r);

/* ps_client_rows.c: embedding rows */
void ps__client_on_rows_reply(struct ps_client *c, int k, const Ps__PullRowsReply *m,
			      const struct ps_frame *f);
void ps__client_rows_free(struct rows_req *rr);
/* A row push none of whose parts was acknowledged, or a row pull waiting
 * (r, kind REQ_PUSH_ROWS or REQ_PULL_ROWS), cut again for the current map
 * from its nold old parts as sent (r->parts all zero, r->nparts ==
 * c->cfg->nshards; c->mu held): 0, or a code with why. */
int ps__client_rows_recut(struct ps_client *c, struct req *r, const struct part *old, int nold,
			  char *why, size_t wl);

/* ps_client_build.c: building a request */
int ps__client_pack_part(struct part *p, const ProtobufCMessage *msg);
int64_t ps__client_reserve_id(struct ps_client *c);
int ps__client_build_push(struct ps_client *c, uint64_t clock, const struct ps_tensor *t,
			  int n, unsigned flags, struct req **out);
int ps__client_build_pull(struct ps_client *c, uint64_t min_version, struct ps_tensor *t,
			  int n, uint64_t after_push, struct req **out);
/* The parts of r (push or pull, its id, tensors, clock set; r->parts all
 * zero, nparts == c->cfg->nshards) for the current map; lrs: the groups'
 * rates. Used again by a re-shard. 0 or a negative code. */
int ps__client_push_parts(struct ps_client *c, struct req *r, const float *lrs);
/* ps_client_recut.c: push r's parts for the new map (c->map) cut again from
 * its old parts' bytes, not encoded again (an error-feedback residual
 * counted once). 0 or a code. */
int ps__client_push_recut(struct ps_client *c, struct req *r, const struct part *old, int nold);
int ps__client_pull_parts(struct ps_client *c, struct req *r);

/* ps_client_conn.c: the connections to the shards (the transport's
 * callbacks, and what the I/O thread's tick does for them) */
void ps__client_on_connect(struct ps_conn *pc, int status);
void ps__client_on_frame(struct ps_conn *pc, struct ps_frame *f);
void ps__client_on_close(struct ps_conn *pc, int status);
void ps__client_take(struct ps_conn *pc, struct ps_frame *f, void *arg);
void ps__client_heartbeats(struct ps_client *c, double now);
void ps__client_reconnect_due(struct ps_client *c, double now);

/* ps_client_stats without the tables' checksums (each 0), which read
 * every row of a table: a re-shard's stop (ps-stat) reads clocks only.
 * Not exported: ps-stat links libps.a. */
int ps__client_stats_clocks(struct ps_client *c, int shard, struct ps_shard_stats *out);
/* ps_client_stop_at with PS_STOP_COMMIT that the shard refuses (PS_ESTATE)
 * unless its declared tensors and tables are decl (the digest every shard
 * answered when it accepted the stop; server/stop.c). ps-stat's commit. */
int ps__client_stop_commit(struct ps_client *c, int shard, uint64_t clock, uint64_t decl,
			   struct ps_shard_stats *out);

#endif
