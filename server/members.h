/* members.h - elastic membership of a shard: which workers count at which
 * clock, joins (two steps over every shard) and leaves (a flag on the push
 * that ends a worker's last clock; in async mode with a staleness, first a
 * freeze). members.c says how. Loop thread only.
 */
#ifndef PS_MEMBERS_H
#define PS_MEMBERS_H

#include <stddef.h>
#include <stdint.h>
#include "ps.pb-c.h"

struct ps_server;
struct ps_srv_conn;

/* Ranks below cluster.initial_workers are members from clock 0; the
 * others are taken out of the live set until they join. After s->live is
 * set. 0 or -ENOMEM. */
int ps__members_init(struct ps_server *s);
void ps__members_free(struct ps_server *s);

/* A shard that resumed from its checkpoint: the intervals from the file
 * beside it (shard-K.members, written at every join and leave), the live
 * set and the joined ranks' clocks set from them. 0 (no file: the initial
 * membership), or a negative code with the file, line and text in err. */
int ps__members_load(struct ps_server *s, char *err, size_t errlen);

/* 1 when the cluster is elastic (initial_workers below workers) or a
 * membership change happened: pull replies then carry the members. */
int ps__members_active(const struct ps_server *s);

/* 1 when rank is a member now (or holds a join): its reconnect makes it
 * live again; 0 for a rank that left or never joined. */
int ps__members_current(const struct ps_server *s, int rank);

/* A push (or row push) of rank for clock: 0 when rank is a member of that
 * clock; else PS_EREFUSED (PS_EPROTO for leave without end) with the
 * reason in why. */
int ps__members_check_push(struct ps_server *s, int rank, uint64_t clock, int end, int leave,
			   char *why, size_t len);

/* Rank's push ending clock - 1 carried leave: it is a member up to
 * clock - 1 and taken out of the live set at once. */
void ps__members_leave(struct ps_server *s, int rank, uint64_t clock);

/* The periodic tick: a hold not followed by its join within
 * limits.drop_timeout_ms (its default as conn.c's) is given up (the joining client is stuck or
 * gone), so the clock it held goes on. */
void ps__members_tick(struct ps_server *s, double now);

/* Async: the highest clock a pull of rank may be answered for now: while
 * a join holds a clock, or another rank's leave froze one (MEMBER_FREEZE),
 * none past it (so the join's and the leave's clocks are exact);
 * UINT64_MAX when none pends, or in sync mode. */
uint64_t ps__members_pull_cap(const struct ps_server *s, int rank);

/* Rank's connections are gone: a join it held and a leave it began are
 * given up. */
void ps__members_cancel(struct ps_server *s, int rank);
/* A leave rank began is given up (why: for the log); the pulls it held
 * back are answered. */
void ps__members_unfreeze(struct ps_server *s, int rank, const char *why);

/* Membership changes in effect at clock c (the epoch of clock c). */
uint64_t ps__members_epoch(const struct ps_server *s, uint64_t c);

/* Fills r's member fields for clock (when ps__members_active); r->members
 * is malloc'ed: the caller frees it. 0 or -ENOMEM. */
int ps__members_fill_pull(const struct ps_server *s, uint64_t clock, Ps__PullReply *r);

/* Handles q's member_op (HOLD, JOIN, FREEZE; q may be NULL) and fills st's
 * member fields; st->members is malloc'ed (the caller frees it) and
 * st->member_error points into err. 0 or -ENOMEM. */
int ps__members_stats(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *q,
		      Ps__Stats *st, char *err, size_t errlen);

/* 1 when a worker's join holds a clock here or a worker is leaving
 * (async MEMBER_FREEZE), with which and a way out in why: a re-shard's stop
 * is refused meanwhile (stop.c); else 0. A HOLD or FREEZE while a stop is
 * pending is refused in turn, with member_status PS_ERESHARD (the client
 * asks again after the stop). */
int ps__members_pending(const struct ps_server *s, char *why, size_t len);

/* Joins and leaves since the start (/metrics). */
void ps__members_counts(const struct ps_server *s, uint64_t *joins, uint64_t *leaves);

/* Replication (cluster.replicas: 1; replica_log.c). The primary: 1 when
 * the membership changed since it was last put in a batch; the whole of
 * it into out (arrays malloc'ed: ps__members_repl_fill_free), which marks
 * it sent; the shard's map epoch goes with it (the backup takes it in
 * ps__members_repl_apply). 0 or -ENOMEM. */
int ps__members_repl_dirty(const struct ps_server *s);
int ps__members_repl_fill(struct ps_server *s, Ps__ReplMembers *out);
void ps__members_repl_fill_free(Ps__ReplMembers *out);
/* The backup: 1 when m is not a membership this shard can hold (the
 * reason in why), else 0. */
int ps__members_repl_check(const struct ps_server *s, const Ps__ReplMembers *m, char *why,
			   size_t len);
/* The backup: the primary's membership from a batch or the snapshot
 * replaces this shard's (live set and finished clocks follow, the file
 * beside the checkpoint is written); m NULL (a snapshot without one): the
 * initial membership. 0, or PS_EPROTO / -ENOMEM with the reason in why
 * (nothing changed). */
int ps__members_repl_apply(struct ps_server *s, const Ps__ReplMembers *m, char *why,
			   size_t len);
/* This process takes over: the live set is the members and the joins
 * held (their holds expire from now). */
void ps__members_takeover(struct ps_server *s, double now);

/* Async: a pull for clock was answered (the highest such clock bounds the
 * holds and freezes, members.c). */
void ps__members_told(struct ps_server *s, uint64_t clock);

/* The clock the slowest-clock rule counts rank at: its ended clock, or
 * the clock a leave froze it at (MEMBER_FREEZE) when lower. */
uint64_t ps__members_counted(const struct ps_server *s, int rank);

#endif
