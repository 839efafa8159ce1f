/* replica.h - the two processes of one shard (cluster.replicas: 1).
 *
 * Each shard has two processes, one at its cluster.servers address
 * (replica 0) and one at its cluster.backups address (replica 1). At any
 * time at most one of them is the primary: it serves the workers and
 * forwards, in order, everything it applies to the other, the backup,
 * which applies the same optimizer steps and so holds bit-identical
 * weights and optimizer state. A push is acknowledged once the backup has
 * confirmed the batch that holds it. What is forwarded (replica_log.c):
 *  - sync: each clock's aggregated gradient per slice (the sum the
 *    optimizer was applied with), not the workers' pushes: the backup's
 *    cost does not grow with the number of workers;
 *  - async: each applied push's gradient;
 * and, with either, the (worker, incarnation, seq) of the pushes the batch
 * completes and the workers' ended clocks, so a push resent after a
 * failover is applied exactly once.
 *
 * Roles (replica.c): a process starts joining; it dials its partner, and
 * the two agree who serves (a primary is joined; a backup whose partner
 * restarted or stepped down takes over; of two joining processes the one
 * with the newer state, else replica 0). The joiner gets the primary's
 * state (snapshot) and the batches after it on the same connection: a
 * backup. A backup that hears nothing from its primary for twice
 * replication.timeout_ms takes over (epoch + 1); a primary whose backup
 * does not answer for replication.timeout_ms stops serving (closes its
 * workers' connections, acknowledges nothing more) and joins again; a
 * primary whose backup's connection ends (the backup process is gone)
 * goes on alone until a new backup joins. docs/reliability.md gives the
 * rule and why no acknowledged push is lost.
 *
 * Embedding tables (replica_rows.c) follow the same path: row updates
 * and expiries in the batches, the tables whole in the snapshot; so do
 * the tensors and tables workers declare at run time (replica_decl.c).
 *
 * Everything runs on the shard's loop thread.
 */
#ifndef PS_REPLICA_H
#define PS_REPLICA_H

#include <stdint.h>
#include <uv.h>
#include "dedup.h"
#include "ps.pb-c.h"

struct ps_server;
struct ps_srv_conn;
struct ps_slot;
struct ps_repl_pending;
struct ps_repl_staged;
struct ps_frame;
struct ps_transport;
struct ps_conn;

enum ps_repl_state {
	PS_REPL_OFF = PS__REPL_STATE__REPL_OFF,
	PS_REPL_JOINING = PS__REPL_STATE__REPL_JOINING,
	PS_REPL_BACKUP = PS__REPL_STATE__REPL_BACKUP,
	PS_REPL_PRIMARY = PS__REPL_STATE__REPL_PRIMARY,
};

/* The batch being gathered on the primary: slice changes in the order the
 * store made them, gradient bytes copied into one payload. */
struct ps_repl_batch {
	Ps__ReplSlot *slots;
	size_t nslots, cap;
	uint8_t *payload;
	size_t plen, pcap;
	Ps__ReplMark *marks;
	size_t nmarks, mcap;
	/* embedding tables: groups of row changes, their records in a payload
	 * of their own sent after the slices' (offsets relative to it here) */
	Ps__ReplRows *rows;
	size_t nrows, rcap;
	uint8_t *rpayload;
	size_t rplen, rpcap;
	/* declarations adopted since the last batch (replica_decl.c): copies
	 * of the workers' messages, the tensors' initial values, and the new
	 * tables' clocks (seconds since their epochs) and versions */
	Ps__Declare *decl;
	uint8_t *decl_values;
	size_t decl_len;
	Ps__DeclareTables *decl_tables;
	double *decl_clocks;
	double decl_wall;           /* the primary's wall clock when decl_clocks were read */
	uint64_t *decl_versions;
	size_t ndecl;
};

struct ps_repl {
	struct ps_server *srv;
	int me;                     /* 0: the cluster.servers address, 1: cluster.backups */
	int state;                  /* enum ps_repl_state */
	uint64_t epoch;             /* raised by each takeover */
	uint64_t lsn;               /* primary: last batch sent; else last applied */
	uint64_t acked;             /* primary: last batch its backup confirmed */
	uint64_t snap_lsn;          /* primary: where the backup's snapshot stands */
	uint64_t failovers;         /* takeovers by this process */
	/* traffic (Stats.repl_*): primary: batches sent to a backup, their
	 * payload bytes, heartbeats sent; backup: applied, and received */
	uint64_t batches, bytes, heartbeats;
	char partner[320];
	/* primary: its backup's connection (accepted), NULL when alone */
	struct ps_srv_conn *link;
	int caught_up;              /* the backup confirmed its snapshot */
	double link_rx;             /* last frame from the partner, either role */
	double last_sent;           /* primary: last batch or heartbeat sent */
	double alone_since;         /* primary without backup: since when (logged once) */
	/* dialing (joining, or a backup whose connection broke) */
	struct ps_transport *t;
	struct ps_conn *out;
	int out_state;              /* enum in replica.c */
	double next_dial, dial_at;
	double unresolved_since, unresolved_said; /* the partner's name: not resolving since, last said */
	uint8_t *hello;
	size_t hello_len;
	char refused[240];          /* the partner's last refusal, logged once */
	int snap_frames;            /* snapshot frames received so far */
	double snap_started;
	uint8_t *snap_tables;       /* joining: the tables' image received so far */
	uint64_t snap_tables_len, snap_tables_got;
	double snap_tables_at;      /* joining: when its first frame came (ps_now_s) */
	double snap_tables_wall;    /* ... and the primary's wall clock at the image (0: not sent) */
	/* committed state, as the backup has it: ended clocks, dedup windows */
	uint64_t *cfinished;
	struct ps_dedup *cdedup;
	/* pushes not acknowledged yet: waiting for their clock (sync), then for
	 * the backup's confirmation of their batch; oldest first */
	struct ps_repl_pending *pending, **pending_tail;
	struct ps_repl_batch b;
	struct ps_repl_staged *staged; /* backup, every_push: gradients kept until their sum */
	uv_check_t check;           /* flushes the batch once per loop turn */
	int handles;                /* check/t open (closed by ps__repl_stop) */
};

/* replica.c: roles */
/* Sets up replication for replica `me` of the server's shard (starts
 * joining). 0 or a negative code. */
int ps__repl_init(struct ps_server *s, int me);
void ps__repl_stop(struct ps_server *s);
void ps__repl_free(struct ps_server *s);
/* Whether workers are served now (the primary, or replication off). */
int ps__repl_serving(const struct ps_server *s);
/* The periodic tick: heartbeats, silence, dialing, takeover. */
void ps__repl_tick(struct ps_server *s);
/* What a process does when its partner dials in (ps__repl_on_partner's
 * rule, docs/reliability.md), from this process's state, replica index,
 * epoch and last batch and what the partner's Hello says; pure. */
enum ps_repl_verdict {
	PS_REPL_V_ACCEPT,       /* a primary: the partner becomes its backup */
	PS_REPL_V_TAKE_OVER,    /* serve (epoch + 1), then accept: a backup whose
				   primary's address is held by a process
				   without the primary's role, or the joining
				   process with the newer state (else replica 0) */
	PS_REPL_V_STEP_DOWN,    /* a primary told of a primary of a later epoch:
				   stop serving, refuse */
	PS_REPL_V_REFUSE,       /* not serving: refused, the partner dials again */
};
int ps__repl_partner_verdict(int state, int me, uint64_t epoch, uint64_t lsn, int peer_state,
			     uint64_t peer_epoch, uint64_t peer_lsn);
/* The dialing side's rule (replica.c on_reply): what this process does
 * with its partner's HelloReply (ok, the partner's state, epoch, batch):
 * ACCEPT: follow it as its backup (an ok from a primary); TAKE_OVER: a
 * refusal from a joining partner, and this is a backup (the process at the
 * primary's address restarted or stepped down) or the joining process
 * with the newer state (else replica 0); REFUSE: dial again. Pure. */
int ps__repl_reply_verdict(int state, int me, uint64_t epoch, uint64_t lsn, int ok,
			   int peer_state, uint64_t peer_epoch, uint64_t peer_lsn);
/* A ROLE_REPLICA Hello passed the handshake on sc: decide who serves and
 * answer (HelloReply, then the snapshot when this one is the primary). */
void ps__repl_on_partner(struct ps_server *s, struct ps_srv_conn *sc);
/* A frame on the primary's link to its backup. */
void ps__repl_on_link_frame(struct ps_server *s, struct ps_srv_conn *sc, unsigned type,
			    ProtobufCMessage *m);
/* sc, the backup's link, closed with status. */
void ps__repl_link_closed(struct ps_server *s, struct ps_srv_conn *sc, int status);
const char *ps__repl_state_name(int state);
/* Fills the replication fields of a Stats reply. */
void ps__repl_stats(const struct ps_server *s, Ps__Stats *st, char *partner, size_t len);

/* replica_log.c: batches, pending acks, the snapshot sent */
void ps__repl_log_init_hooks(struct ps_server *s);
/* Gather a push's ack: sent once its clock is applied (sync) and its batch
 * confirmed. sc may close meanwhile (the ack is then dropped). */
int ps__repl_push_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			   const Ps__Push *m, int rank, uint64_t incarnation);
/* A resent push the shard has seen: 1 when it is still pending (its ack
 * now goes to sc / req_id), 0 when it was acknowledged (ack it again). */
int ps__repl_resent(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id, int rank,
		    uint64_t incarnation, uint64_t seq);
/* A reply (type, m) telling of state this primary changed (a join step's
 * answer): sent once the backup confirmed the batch that holds that state
 * (at the end of this loop turn when alone). 0 or -ENOMEM. */
int ps__repl_reply_later(struct ps_server *s, struct ps_srv_conn *sc, unsigned type,
			 const ProtobufCMessage *m);
/* sc is closing: its pending acks go nowhere. */
void ps__repl_conn_gone(struct ps_server *s, struct ps_srv_conn *sc);
/* Builds and sends the batch now (also called by the loop's check handle). */
void ps__repl_flush(struct ps_server *s);
/* Acks every pending push whose batch the backup confirmed (all committed
 * ones when alone). */
void ps__repl_release(struct ps_server *s);
/* Drops every pending ack (stepping down). */
void ps__repl_drop_pending(struct ps_server *s);
/* Sends the snapshot to the new backup on sc. */
int ps__repl_send_snapshot(struct ps_server *s, struct ps_srv_conn *sc);
/* replica_apply.c, the backup: a snapshot or batch frame from the
 * primary; 0 or a negative code (the connection is then closed and the
 * state transferred again). */
int ps__repl_on_snapshot(struct ps_server *s, const Ps__ReplSnapshot *m,
			 const struct ps_frame *f, int *done);
int ps__repl_on_batch(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f);
/* The committed state becomes the working state (takeover) and back. */
void ps__repl_adopt_committed(struct ps_server *s);
void ps__repl_note_finished(struct ps_server *s, int rank);
/* Embedding tables (rows.c): a row update of table t made by the
 * primary's ps_table_push_at (g: dim floats), the end of a push or clock
 * (the table's version is now what the batch carries), rows expired at
 * stamp; and a row push accepted: acknowledged once committed (t >= 0,
 * sync: table t has applied clock; t -1: at once) and confirmed. */
void ps__repl_note_row(struct ps_server *s, int t, uint64_t id, const float *g, int sightings,
		       uint32_t stamp);
void ps__repl_note_rows_done(struct ps_server *s, int t);
void ps__repl_note_expired(struct ps_server *s, int t, uint32_t stamp, uint64_t n);
int ps__repl_rows_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id,
			   int rank, uint64_t incarnation, uint64_t seq, uint64_t clock, int t);
/* A declaration accepted (declare.c, decl_tables.c): its ack is sent once
 * the batch that carries it (or follows it) is confirmed; not counted as a
 * push's. 0 or -ENOMEM. */
int ps__repl_decl_accepted(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id);
/* replica_log.c, for replica_rows.c: grows an array to need elements;
 * sends the batch gathered (with_state: the ended clocks too). */
int ps__repl_grow(void **p, size_t *cap, size_t need, size_t elem);
void ps__repl_send_batch(struct ps_server *s, int with_state);
/* replica_rows.c: a batch's row groups checked (all first) and applied;
 * the tables' image sent (clocks[t]: each table's seconds since its
 * epoch), a part of it received, and restored at the snapshot's end. */
int ps__repl_rows_check(const struct ps_server *s, const Ps__ReplBatch *m,
			const struct ps_frame *f);
int ps__repl_rows_apply(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f);
int ps__repl_send_tables(struct ps_server *s, struct ps_srv_conn *sc, Ps__ReplSnapshot *m,
			  double *clocks);
int ps__repl_tables_part(struct ps_server *s, const Ps__ReplSnapshot *m,
			 const struct ps_frame *f);
int ps__repl_tables_restore(struct ps_server *s, const double *clocks);
/* The seconds since the primary read its tables' clocks at `wall` on its
 * wall clock (0: not sent), by this host's wall clock (now wall_now) when
 * that lies within a second of [lo, hi], the bounds this process saw of
 * that delay (the margin: the hosts' clock skew); else lo, with a warning
 * naming what (the transfer, a batch) and the difference. */
double ps__repl_since_wall(double wall, double wall_now, double lo, double hi, const char *what);
/* replica_decl.c: declarations. The primary notes a worker's Declare it
 * adopted (values: the payload, len bytes) or DeclareTables (the tables
 * now last in s->rows) for the batch being gathered; the batch's copies
 * are put into m (the values at offset in its payload) and freed. The
 * backup applies a batch's declarations (before the rest of it). The state
 * transfer's first frame (nothing sent without declarations) and its
 * application. 0 or a negative code. */
void ps__repl_note_declare(struct ps_server *s, const Ps__Declare *m, const void *values,
			   uint64_t len);
void ps__repl_note_declare_tables(struct ps_server *s, const Ps__DeclareTables *m);
void ps__repl_decl_fill(struct ps_repl_batch *b, Ps__ReplBatch *m, uint64_t offset);
void ps__repl_decl_clear(struct ps_repl_batch *b);
int ps__repl_decl_apply(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f);
int ps__repl_send_decl(struct ps_server *s, struct ps_srv_conn *sc, uint64_t lsn, uint64_t epoch);
int ps__repl_snapshot_decl(struct ps_server *s, const Ps__ReplSnapshot *m);
/* replica_apply.c, the backup, every_push: forgets the kept gradients of
 * sl below clock `below` (all of them with sl NULL). */
void ps__repl_staged_free(struct ps_server *s, const struct ps_slot *sl, uint64_t below);

#endif
