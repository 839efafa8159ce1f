/* server_int.h - what the files of a shard share (not a public API;
 * server.h is).
 *
 *   server.c   life cycle; the clocks derived from the workers' finished
 *              clocks; the named-twice check of a request's slices
 *   conn.c     connections: transport callbacks, handshake, dispatch, tick
 *   push.c     push requests
 *   pull.c     pull requests and the pulls waiting for their condition
 *   admin.c    stats requests and checkpoints
 *
 * Everything runs on the shard's loop thread.
 */
#ifndef PS_SERVER_INT_H
#define PS_SERVER_INT_H

#include <stddef.h>
#include <stdint.h>
#include "ps.pb-c.h"
#include "server.h"

enum { CONN_HELLO, CONN_AUTH, CONN_READY, CONN_REFUSED };

struct ps_srv_conn {
	struct ps_server *srv;
	struct ps_conn *conn;
	int state;
	int rank;                  /* worker rank; -1 for a monitor */
	uint64_t incarnation;
	uint64_t done_clock;       /* Hello.done_clock */
	uint8_t transcript[32];    /* CONN_AUTH: T of auth.h */
	double accepted;
	double last_rx;            /* ps_now_s() of the last frame received */
	int evicted;               /* closed to make room for a newer handshake */
	int nwaiting;              /* its pulls parked in s->waiting */
	uint64_t waiting_bytes;    /* bytes its parked row pulls hold (rows.c) */
	int authed;                /* proved the secret (or security.auth is off) */
	char *refusal;             /* CONN_AUTH: why the Hello is refused, told once proven */
	int is_replica;            /* the shard's other process dialed (Hello ROLE_REPLICA) */
	int hello_replica;         /* its Hello said ROLE_REPLICA, accepted or not */
	int repl_auth;             /* the handshake proves the replication key, not the secret */
	int is_reader;             /* a reader (Hello ROLE_READER): pulls only, rank -1 */
	int is_link;               /* ... and is this primary's backup now (replica.h) */
	int peer_state;            /* its Hello: ReplState, epoch, last batch */
	uint64_t peer_epoch, peer_lsn;
	struct ps_srv_conn *prev, *next;
};

struct ps_waiting_pull {
	struct ps_srv_conn *sc;
	uint64_t req_id, min_version, clock;
	double arrived;            /* ps_now_s() when the pull came in */
	int warned;                /* the tick logged that it is held long */
	int codec;                 /* reply encoding: PS_CODEC_NONE or PS_CODEC_FP16 */
	uint32_t n;
	struct ps_waiting_pull *next;
	struct ps_slot *slots[];
};

/* reader.c */
/* A reader's request of frame type `type` (message m) that would change
 * the shard (push, row push, declare, a checkpoint or a resume clock in a
 * stats request): answered with an Error "a reader may only pull: push
 * refused" (PS_EREFUSED), counted in c.reader_refused, logged (the first
 * 16, then at powers of two); nothing is applied and the connection stays
 * open. Returns 1 when refused, 0 for a request a reader may make. */
int ps__srv_reader_refuses(struct ps_server *s, struct ps_srv_conn *sc, int type,
			   const ProtobufCMessage *m);

/* server.c */
/* The slowest finished clock over the live workers (the fastest when none
 * is live). */
uint64_t ps__srv_min_finished(const struct ps_server *s);
/* Starts a request's check for slices named twice. */
void ps__srv_seen_reset(struct ps_server *s);
/* 1 when slot sl was already named by the current request. */
int ps__srv_seen_twice(struct ps_server *s, const struct ps_slot *sl);
/* The clock a (re)connecting worker continues from (HelloReply.clock). */
uint64_t ps__srv_resume_clock(const struct ps_server *s);

/* conn.c: the transport's callbacks and the periodic tick */
void ps__srv_on_accept(struct ps_transport *t, struct ps_conn *c);
void ps__srv_on_frame(struct ps_conn *c, struct ps_frame *f);
void ps__srv_on_close(struct ps_conn *c, int status);
void ps__srv_on_tick(uv_timer_t *t);

/* push.c: takes ownership of f */
void ps__srv_handle_push(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Push *m,
			 struct ps_frame *f);

/* declare.c: a worker's Declare (tensors of a config without a model) */
void ps__srv_handle_declare(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Declare *m,
			    const struct ps_frame *f);
/* A declaration from rank (0 on a backup: the primary adopted it) with
 * values (values_len bytes, the payload) checked and either adopted
 * (*adopted 1: the shard had no tensors, rank 0) or compared with the
 * shard's tensors. 0, or a negative code with the reason in why (-EAGAIN:
 * not rank 0 and nothing declared yet). */
int ps__srv_declare_msg(struct ps_server *s, int rank, const Ps__Declare *m, const void *values,
			uint64_t values_len, int *adopted, char *why, size_t wl);
/* Makes list (n tensors) the shard's tensors: its own config copy, map and
 * store, the owned slices' weights from values (values_len bytes, in slice
 * id order) or zeros when values is NULL (a checkpoint fills them next),
 * updated by the optimizer groups groups[0..ngroups) (list[i].group each;
 * ngroups 0: the config's optimizer). 0, or a negative code with the reason in why; the shard is unchanged then. */
int ps__srv_declare_adopt(struct ps_server *s, const struct ps_tensor_cfg *list, int n,
			  const struct ps_optim_cfg *groups, int ngroups, const void *values,
			  uint64_t values_len, char *why, size_t wl);

/* What the workers declared at run time, as one number: 0 when nothing
 * (no tensors of a config without a model, no declared tables), else a
 * digest of the declared tensors' names, shapes and optimizer groups and
 * the declared tables' definitions. Equal on two shards when they hold the
 * same declarations (Stats.decl_digest; a re-shard's stop commits only
 * when every shard's is the same: stop.c). */
uint64_t ps__srv_decl_digest(const struct ps_server *s);

/* decl_tables.c: a worker's DeclareTables (embedding tables at run time) */
void ps__srv_handle_declare_tables(struct ps_server *s, struct ps_srv_conn *sc,
				   const Ps__DeclareTables *m);
/* ps__srv_declare_msg's counterpart for tables: adopted (*adopted 1) or
 * compared. 0, or a negative code with the reason in why. */
int ps__srv_declare_tables_msg(struct ps_server *s, int rank, const Ps__DeclareTables *m,
			       int *adopted, char *why, size_t wl);
/* Appends list (n definitions, checked) to the shard's tables, in its own
 * config copy, and sets up their rows. 0, or a negative code with the
 * reason in why; the shard is unchanged then. */
int ps__srv_tables_adopt(struct ps_server *s, const struct ps_table_cfg *list, int n, char *why,
			 size_t wl);

/* The checkpoint's section of declared tables (file versions 3 and 4,
 * checkpoint.c; layout in decl_tables.c): its bytes now (0 without
 * declared tables), its copy into b, and its load from fd at pos (a file
 * of len bytes, path for messages): the shard's tables when it has none
 * declared yet, else compared with them. 0, or a negative code with the
 * reason in err. */
size_t ps__srv_tables_ckpt_size(const struct ps_server *s);
void ps__srv_tables_ckpt_put(const struct ps_server *s, uint8_t *b);
int ps__srv_tables_ckpt_load(struct ps_server *s, int fd, uint64_t pos, uint64_t len,
			     const char *path, char *err, size_t errlen);

/* pull.c */
void ps__srv_handle_pull(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Pull *m);
/* Answers every waiting pull whose condition now holds. */
void ps__srv_answer_pulls(struct ps_server *s);
/* Why p is not answered yet, into buf (len bytes): the workers whose
 * clock it waits for and what the shard knows of each ("waiting for
 * workers 1 of 2 at clock 0 (worker 1 never connected)"), so that a
 * worker's timeout names them instead of blaming the shard. */
void ps__srv_pull_held_why(const struct ps_server *s, const struct ps_waiting_pull *p,
			   char *buf, size_t len);
/* Closes sc when its unread replies exceed limits.max_write_queue_bytes
 * plus one frame; 1 when it did. */
int ps__srv_check_backlog(struct ps_server *s, struct ps_srv_conn *sc);

/* admin.c */
void ps__srv_handle_stats(struct ps_server *s, struct ps_srv_conn *sc,
			  const Ps__StatsRequest *m);
/* Writes the checkpoint now, blocking, and logs the outcome; 0 or a
 * negative code. For stopping: a checkpoint being written in the
 * background is waited for first (ps__srv_on_signal). */
int ps__srv_write_checkpoint(struct ps_server *s, const char *why, uint64_t *bytes,
			     double *secs, char *err, size_t errlen);
void ps__srv_on_ckpt_timer(uv_timer_t *t);
/* Starts a full checkpoint in the background (the forked writer for a
 * state of checkpoint.fork_bytes or more) and logs its outcome at warn
 * ("checkpoint (WHY) written: ..."); 0, or a negative code (logged). */
int ps__srv_ckpt_start_full(struct ps_server *s, const char *why);
/* SIGUSR1: a re-shard's pre-copy (docs/elastic.md): a full checkpoint now,
 * in the background, and the stop's checkpoint an incremental one on it. */
void ps__srv_precopy(struct ps_server *s);
/* sc is closing: a checkpoint it asked for will not be answered. */
void ps__srv_ckpt_forget(struct ps_server *s, struct ps_srv_conn *sc);
/* Tick: collects the forked checkpoint writer once it has exited. */
void ps__srv_ckpt_poll(struct ps_server *s);

/* stop.c: a live re-shard's stop at a clock boundary */
/* A StatsRequest with stop_at, stop_commit or stop_cancel: 0 (answer with
 * Stats), or a negative code with the reason in err (answer with it). */
int ps__srv_stop_request(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *m,
			 char *err, size_t errlen);
/* Push m is for a clock the shard stopped before: refused (answered
 * here, retryable, nothing marked); 1 when it was. */
int ps__srv_stop_refuse(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Push *m);
/* The same for a row push (rows.c). */
int ps__srv_stop_refuse_rows(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PushRows *m);
/* Whether the stop held now refuses a declaration from rank that would
 * create tensors or tables (declare.c, decl_tables.c): every one while it
 * is prepared; once committed, one from a worker that finished the clocks
 * below the stop or is not live (the others are taken: the stop waits for
 * them). */
int ps__srv_stop_fences_decl(const struct ps_server *s, int rank);
/* Tick: a committed stop whose clocks are all closed checkpoints and
 * stops the shard. */
void ps__srv_stop_poll(struct ps_server *s);
/* Replication: the stop into batch m (when s->stop_dirty), and a batch's
 * or snapshot's stop taken by the backup (0, or PS_EPROTO out of range). */
void ps__srv_stop_repl_fill(struct ps_server *s, Ps__ReplBatch *m);
int ps__srv_stop_repl_apply(struct ps_server *s, uint64_t stop_at, int committed);

#endif
