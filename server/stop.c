/* stop.c - a live re-shard's stop at a clock boundary (docs/elastic.md,
 * "Re-sharding while the workers run").
 *
 * A monitor (ps-stat --stop-for-reshard, never a worker or a reader)
 * first asks every shard to stop at clock B: from then on a push for B or
 * later is refused with PS_ERESHARD, which the client library takes as
 * "keep it and send it again" (on the new map once the shards change), and
 * nothing of it is marked in the dedup window, so the push is new to
 * whichever shard takes it later. A shard that took a push for B or later
 * already refuses the stop (PS_ECLOCK, its top clock named): the monitor
 * asks every shard again with a higher B, which the shards that accepted
 * take (raising their stop). Once every shard accepted the same B the
 * monitor commits: each shard goes on closing the clocks below B as usual
 * (pulls answered as usual), then writes its checkpoint, at B on every
 * shard, and exits 0. Before the commit a stop can be cancelled.
 *
 * Declarations (declare.c, decl_tables.c): a shard holding a stop it has
 * not committed refuses one that would create tensors or tables, so what
 * it declared is fixed from its accepting the stop to its commit or a
 * cancel. A declaration reaches the shards one by one, so one taken by
 * some before their stop and refused by others after theirs leaves them
 * differing: the monitor compares every shard's declarations
 * (Stats.decl_digest) in their answers and commits only when all are the
 * same, sending that digest with each commit, which a shard whose
 * declarations differ refuses (its stop was cancelled and a declaration
 * came). Else the monitor cancels the stops and the declaration completes
 * first (worker/ps_stat_reshard.c). Committed, a shard takes the
 * declaration of a worker that has not ended the clocks below the stop,
 * which the stop waits for (ps__srv_stop_fences_decl), and passes over
 * the clocks a declared slice missed (ps__srv_stop_poll).
 *
 * Row pushes (embedding tables) are stopped the same way: one for clock B
 * or later is refused with PS_ERESHARD before its dedup check, and the
 * clocks of the row pushes taken count in the top clock. Sync and async
 * training alike. A refused push also tells that its worker finished the
 * clocks below it (reached_stop): a worker that never ends a clock (rows
 * alone) would otherwise hold a committed stop forever.
 *
 * With cluster.replicas: 1 the stop reaches both processes of a pair
 * through replication: the primary puts every change of its stop (asked,
 * raised, committed, cancelled) into its next batch, and answers the
 * monitor only once its backup confirmed that batch, as it answers a
 * join; the backup holds the same stop. So whatever the monitor was told,
 * the backup has, and a backup that takes over refuses the same pushes
 * and finishes the stop. Once committed and every clock below the stop
 * closed, the primary waits until its backup confirmed every batch (the
 * two hold the same state, at the stop's clock), then writes its
 * checkpoint and exits; the backup, whose state reaches that clock with
 * the same batches, writes its own checkpoint (shard-K-r1.ckpt) and exits
 * by itself. A process that dies meanwhile leaves its partner to write
 * the pair's state at the stop; the re-shard reads the newer file of each
 * pair (reshard.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "msg.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

int ps__srv_stop_request(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *m,
			 char *err, size_t errlen)
{
	if (sc->rank >= 0 || sc->is_reader || sc->is_replica) {
		snprintf(err, errlen, "a stop for a re-shard is asked by a monitor (ps-stat), not by "
			 "a %s", sc->rank >= 0 ? "worker" : sc->is_reader ? "reader" : "replica");
		return PS_ESTATE;
	}
	if (!s->ckpt_path[0]) {
		snprintf(err, errlen, "a stop for a re-shard needs checkpoint.dir: the new shards "
			 "start from the checkpoints written at the stop");
		return PS_ESTATE;
	}
	if (!ps__repl_serving(s)) {
		snprintf(err, errlen, "this process is not its pair's primary: the stop is asked "
			 "of the primary, which forwards it to its backup");
		return PS_ESTATE;
	}
	if (m->stop_cancel) {
		if (s->stop_committed) {
			snprintf(err, errlen, "the stop at clock %" PRIu64 " was committed: the shard "
				 "exits once that clock is reached", s->stop_at);
			return PS_ESTATE;
		}
		if (s->stop_at)
			ps_info("re-shard stop at clock %" PRIu64 " cancelled by %s: taking pushes again",
				s->stop_at, sc->conn->peer);
		s->stop_dirty |= s->stop_at != 0;
		s->stop_at = 0;
		s->stop_owner = 0;
		return 0;
	}
	/* one change at a time (docs/elastic.md, "Operations"): another
	 * monitor's stop at another clock is another re-shard (the same clock
	 * is the same stop, committed by whoever finishes it), and a join or
	 * leave under way is finished first */
	if (s->stop_at && m->stop_at != s->stop_at && sc->incarnation != s->stop_owner) {
		snprintf(err, errlen, "another re-shard is in progress: shard %d holds a stop at "
			 "clock %" PRIu64 " (%s) asked by another monitor", s->shard, s->stop_at,
			 s->stop_committed ? "committed" : "prepared");
		return PS_ESTATE;
	}
	if (!s->stop_at && ps__members_pending(s, err, errlen))
		return PS_ESTATE;
	if (!m->stop_at || m->stop_at >= PS_MAX_CLOCK) {
		snprintf(err, errlen, "stop_at %" PRIu64 " out of range (1 to 2^53 - 1)", m->stop_at);
		return PS_ECLOCK;
	}
	if (s->stop_committed && m->stop_at != s->stop_at) {
		snprintf(err, errlen, "committed to stop at clock %" PRIu64 " already, not %" PRIu64,
			 s->stop_at, m->stop_at);
		return PS_ESTATE;
	}
	if (s->top_clock > m->stop_at) {
		snprintf(err, errlen, "a push for clock %" PRIu64 " was taken already: stop at %"
			 PRIu64 " or later", s->top_clock - 1, s->top_clock);
		return PS_ECLOCK;
	}
	if (m->stop_commit && m->stop_decl_check && !s->stop_committed &&
	    ps__srv_decl_digest(s) != m->stop_decl) {
		/* the monitor saw every shard hold the same declarations when
		 * each accepted the stop, and a shard holding it declares
		 * nothing new: this one's changed, so its stop was cancelled
		 * meanwhile (another monitor) and a declaration came */
		snprintf(err, errlen, "not committed: shard %d's declared tensors and tables (%d "
			 "tensors, %d tables) are not those every shard held when it accepted the "
			 "stop at clock %" PRIu64 " (a declaration came since: was the stop "
			 "cancelled?)", s->shard, s->cfg->declare ? s->cfg->ntensors : 0,
			 s->cfg->ndecl_tables, m->stop_at);
		return PS_ESTATE;
	}
	if (m->stop_at != s->stop_at)
		ps_info("re-shard: stopping at clock %" PRIu64 " (asked by %s): pushes for it and "
			"later are refused, to be sent again on the new map", m->stop_at,
			sc->conn->peer);
	s->stop_dirty |= s->stop_at != m->stop_at;
	if (!s->stop_at)
		s->stop_owner = sc->incarnation;
	s->stop_at = m->stop_at;
	if (m->stop_commit && !s->stop_committed) {
		s->stop_committed = 1;
		s->stop_dirty = 1;
		ps_info("re-shard: stop at clock %" PRIu64 " committed: checkpoint and exit once "
			"every clock below it is closed (now at %" PRIu64 ")", s->stop_at,
			ps__srv_resume_clock(s));
		/* the tick stops the shard (ps__srv_stop_poll), after this
		 * request's answer */
	}
	return 0;
}

/* A push for clock c >= the stop came from worker rank: the worker has
 * ended every clock below c (a client sends a clock's pushes before the
 * next clock's, in order on each connection), so it is done with the
 * clocks below the stop even when it never said so. A worker that ends
 * its clocks with PS_PUSH_END_CLOCK has finished them here already; one
 * that never does (it pushes embedding rows alone, or dense tensors
 * without the flag) has finished nothing, and without this the commit
 * would wait for it forever. Its finished clock is raised to the stop, as
 * an ended clock raises it (push.c), so the clocks below close and the
 * checkpoint is at the stop, as on every other shard. */
static void reached_stop(struct ps_server *s, int rank)
{
	if (rank < 0 || rank >= s->cfg->nworkers || s->finished[rank] >= s->stop_at)
		return;
	ps_debug("re-shard: worker %d pushed for the stop's clock %" PRIu64 " having finished %"
		 PRIu64 " here: done with the clocks below", rank, s->stop_at, s->finished[rank]);
	s->finished[rank] = s->stop_at;
	ps__repl_note_finished(s, rank);
	/* a batch goes out with the finished clocks, and the primary checkpoints
	 * only once its backup confirmed it (ps__srv_stop_poll): the backup's
	 * clocks close too, and it writes its own checkpoint at the stop */
	s->stop_dirty |= s->repl != NULL;
	ps_store_advance(&s->store); /* its clocks ended with no push for some slice */
	ps__rows_advance(s);
	if (s->waiting)
		ps__srv_answer_pulls(s);
}

/* Order. A worker sends a clock's pushes in order, the last ending the
 * clock (PS_PUSH_END_CLOCK), and a shard closes a clock on a slice no push
 * of an ended clock named. A push the stop refused leaves that order: the
 * client sends it again 0.1 s later (ps_client_conn.c), while the pushes
 * behind it were on their way already. When the monitor raises the stop
 * meanwhile (another shard had taken a push for the stop's clock), the
 * ending push behind would be taken, the clock closed without the refused
 * push's slices, and the refused push, sent again, refused for a clock
 * passed (seen under load in it_reshard_live_pairs.sh: the worker failed).
 * So a worker's pushes numbered after its first refused one are refused
 * the same way until that one comes again; the client sends them again in
 * their order. Pushes without a number (seq 0) are not held. */
static int refuse(struct ps_server *s, struct ps_srv_conn *sc, uint64_t req_id, uint64_t clock,
		  uint64_t seq, const char *kind)
{
	int r = sc->rank, ranked = r >= 0 && r < s->cfg->nworkers && seq;
	struct ps_stop_held *h = ranked ? &s->stop_held[r] : NULL;

	if (h && h->seq && h->incarnation != sc->incarnation)
		h->seq = 0; /* another process of the rank starts afresh */
	if (s->stop_at && clock >= s->stop_at) {
		ps_msg_send_error(sc->conn, req_id, PS_ERESHARD, "%s for clock %" PRIu64 " refused: "
				  "the shard stops at clock %" PRIu64 " for a re-shard; it is sent "
				  "again on the new map", kind, clock, s->stop_at);
		if (h && (!h->seq || seq < h->seq))
			*h = (struct ps_stop_held){ seq, sc->incarnation };
		reached_stop(s, r);
		return 1;
	}
	if (!h || !h->seq || seq < h->seq)
		return 0;
	if (seq > h->seq) {
		ps_msg_send_error(sc->conn, req_id, PS_ERESHARD, "%s %" PRIu64 " for clock %" PRIu64
				  " refused: push %" PRIu64 " of this worker, refused at the "
				  "re-shard's stop, comes first; it is sent again after it", kind,
				  seq, clock, h->seq);
		return 1;
	}
	h->seq = 0; /* the refused push came again: the ones behind it follow */
	return 0;
}

int ps__srv_stop_refuse(struct ps_server *s, struct ps_srv_conn *sc, const Ps__Push *m)
{
	return refuse(s, sc, m->req_id, m->clock, m->seq, "push");
}

int ps__srv_stop_refuse_rows(struct ps_server *s, struct ps_srv_conn *sc, const Ps__PushRows *m)
{
	return refuse(s, sc, m->req_id, m->clock, m->seq, "row push");
}

/* Prepared, a stop fences every declaration that would create tensors or
 * tables: what the shard declares holds from its accepting the stop to a
 * cancel or the commit, and the monitor commits only when every shard
 * declares the same. Committed, it closes the clocks below the stop, and
 * it cannot without a worker that has not finished them (a live one: in
 * sync every clock waits for it, in async the commit does): such a worker
 * declaring was held forever, refused, never ending its clock. Its
 * declaration is taken (no shard reaches its checkpoint before the worker
 * ends those clocks, so the worker's declaration reaches every shard
 * first: one still prepared refuses it until its commit, which follows at
 * once, and the worker asks again); a worker that finished them, or one
 * the stop does not wait for (not live: dropped), is refused (the shard
 * may be writing its checkpoint and gone), and declares on the new map. A worker finished the same clocks on every
 * shard when it declares: a clock is ended on every shard by the push
 * sent before the declaration on each connection. */
int ps__srv_stop_fences_decl(const struct ps_server *s, int rank)
{
	if (!s->stop_at)
		return 0;
	return !s->stop_committed || rank < 0 || rank >= s->cfg->nworkers || !s->live[rank] ||
	       s->finished[rank] >= s->stop_at;
}

/* Sync: whether every table applied the clocks below the stop (the
 * dense clocks closing imply it: a table's clock is applied once every
 * live worker ended it; checked, as the checkpoint keeps no pending row
 * gradients). */
static int tables_closed(const struct ps_server *s)
{
	for (int t = 0; s->rows && s->cfg->consistency == PS_SYNC && t < s->rows->ntables; t++)
		if (s->rows->t[t].tb.version < s->stop_at)
			return 0;
	return 1;
}

void ps__srv_stop_poll(struct ps_server *s)
{
	char err[512];
	uint64_t bytes;
	double secs;

	if (!s->stop_committed || s->stopping || s->ckpt_job)
		return;
	/* slices declared after the workers ended clocks start behind them
	 * (at version 0), and no push comes for those clocks: passed over, as
	 * a clock ended with no push for a slice is (a primary's batch tells
	 * its backup) */
	if (ps__repl_serving(s) && ps_store_advance(&s->store)) {
		s->stop_dirty |= s->repl != NULL;
		if (s->waiting)
			ps__srv_answer_pulls(s);
	}
	if (ps__srv_resume_clock(s) < s->stop_at || !tables_closed(s))
		return;
	if (s->repl && s->repl->state == PS_REPL_JOINING)
		return; /* no state of its own yet: its partner's comes first */
	if (s->repl && s->repl->state == PS_REPL_PRIMARY && s->repl->link &&
	    (s->stop_dirty || s->repl->acked < s->repl->lsn))
		return; /* the backup confirms every batch first: both at the stop */
	if (ps__srv_write_checkpoint(s, "re-shard stop", &bytes, &secs, err, sizeof(err)))
		s->exit_status = 1;
	else
		ps_info("re-shard: stopped at clock %" PRIu64 " with its checkpoint written; exiting%s",
			s->stop_at, s->repl && s->repl->state == PS_REPL_BACKUP ?
			" (the backup, as its primary does)" : "");
	ps_server_stop(s);
}

void ps__srv_stop_repl_fill(struct ps_server *s, Ps__ReplBatch *m)
{
	m->stop_set = 1;
	m->stop_at = s->stop_at;
	m->stop_committed = s->stop_committed;
}

int ps__srv_stop_repl_apply(struct ps_server *s, uint64_t stop_at, int committed)
{
	if (stop_at >= PS_MAX_CLOCK || (committed && !stop_at)) {
		ps_warn("replication: a re-shard stop at clock %" PRIu64 "%s: out of range", stop_at,
			committed ? ", committed" : "");
		return PS_EPROTO;
	}
	if (stop_at && (stop_at != s->stop_at || (committed && !s->stop_committed)))
		ps_info("re-shard: the primary stops at clock %" PRIu64 "%s: so does this backup",
			stop_at, committed ? ", committed" : "");
	else if (!stop_at && s->stop_at)
		ps_info("re-shard: the primary's stop at clock %" PRIu64 " was cancelled", s->stop_at);
	s->stop_at = stop_at;
	s->stop_committed = committed;
	return 0;
}
