/* replica_apply.c - the backup's side of replication (replica.h): the
 * state transfer's frames and the primary's batches, taken in.
 *
 * The backup applies the snapshot and the batches after it the way the
 * primary applied them (replica_log.c sends them), checking every number
 * against what it holds, so a batch that does not follow is refused and
 * the state transferred again. As a checkpoint's are when it is loaded,
 * versions, step counts, ended clocks, batch numbers and epochs must be
 * below 2^53 and every float finite; a batch is checked whole before any
 * of it is applied. Under replication.forward: every_push (sync) the
 * backup keeps each worker's gradient until the batch that sums its clock
 * and takes their rank-ordered sum, as the primary's store did. The
 * tables' part of both is replica_rows.c's; the declarations',
 * replica_decl.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "ps_time.h"
#include "finite.h"
#include "msg.h"
#include "optim_group.h"
#include "ps_err.h"
#include "ps_log.h"
#include "members.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

/* ---- every_push: the workers' gradients the backup keeps until the sum ---- */

struct ps_repl_staged {
	struct ps_slot *sl;
	uint64_t clock;
	int rank;
	struct ps_repl_staged *next;
	float g[];
};

void ps__repl_staged_free(struct ps_server *s, const struct ps_slot *sl, uint64_t below)
{
	struct ps_repl_staged **pp = &s->repl->staged, *x;

	while ((x = *pp)) {
		if (!sl || (x->sl == sl && x->clock < below)) {
			*pp = x->next;
			free(x);
		} else {
			pp = &x->next;
		}
	}
}

static int stage(struct ps_server *s, struct ps_slot *sl, const Ps__ReplSlot *x,
		 const uint8_t *data)
{
	struct ps_repl_staged *st;

	if (!x->has_grad || x->rank < 0 || x->rank >= s->cfg->nworkers || x->version < sl->version)
		return PS_EPROTO;
	st = malloc(sizeof(*st) + x->length);
	if (!st)
		return -ENOMEM;
	st->sl = sl;
	st->clock = x->version;
	st->rank = x->rank;
	memcpy(st->g, data, x->length);
	st->next = s->repl->staged;
	s->repl->staged = st;
	return 0;
}

/* The rank-ordered sum (optimizer.average: the mean) of the gradients kept
 * for sl at clock, into s->store.scratch, as the primary's store took it;
 * NULL when none. */
static const float *staged_sum(struct ps_server *s, struct ps_slot *sl, uint64_t clock)
{
	size_t n = (size_t)sl->slice->count;
	float *acc = s->store.scratch;
	int have = 0;

	for (int r = 0; r < s->cfg->nworkers; r++)
		for (struct ps_repl_staged *x = s->repl->staged; x; x = x->next)
			if (x->sl == sl && x->clock == clock && x->rank == r) {
				if (!have++)
					memcpy(acc, x->g, n * sizeof(float));
				else
					for (size_t i = 0; i < n; i++)
						acc[i] += x->g[i];
				break;
			}
	if (have > 1 && sl->ocfg->average) {
		/* optimizer.average: the mean, as the primary's store took it */
		const float k = (float)have;
		for (size_t i = 0; i < n; i++)
			acc[i] /= k;
	}
	return have ? acc : NULL;
}

/* ---- the state transfer's frames, then the batches ---- */

int ps__repl_on_snapshot(struct ps_server *s, const Ps__ReplSnapshot *m,
			 const struct ps_frame *f, int *done)
{
	struct ps_repl *r = s->repl;
	size_t nw = (size_t)s->cfg->nworkers;

	*done = 0;
	if (m->lsn >= PS_MAX_CLOCK || m->epoch >= PS_MAX_CLOCK || m->version >= PS_MAX_CLOCK ||
	    m->steps >= PS_MAX_CLOCK) {
		ps_warn("replication: snapshot frame at batch %" PRIu64 " of epoch %" PRIu64 " with "
			"version %" PRIu64 " and %" PRIu64 " steps: out of range (at most 2^53 - 1)",
			m->lsn, m->epoch, m->version, m->steps);
		return PS_EPROTO;
	}
	if (m->declare || m->declare_tables)
		return ps__repl_snapshot_decl(s, m);
	if (m->tables)
		return ps__repl_tables_part(s, m, f);
	if (m->last) {
		int ntables = s->rows ? s->rows->ntables : 0;
		if (m->n_table_clocks != (size_t)ntables ||
		    (ntables && r->snap_tables_got != r->snap_tables_len)) {
			ps_warn("replication: snapshot end with %zu tables and %" PRIu64 " of %" PRIu64
				" bytes of them; this shard has %d tables", m->n_table_clocks,
				r->snap_tables_got, r->snap_tables_len, ntables);
			return PS_EPROTO;
		}
		if (m->n_finished != nw || f->hdr.payload_len != nw * sizeof(*s->dedup)) {
			ps_warn("replication: snapshot end with %zu clocks and %" PRIu64 " dedup bytes "
				"for %zu workers", m->n_finished, f->hdr.payload_len, nw);
			return PS_EPROTO;
		}
		for (size_t i = 0; i < nw; i++)
			if (m->finished[i] >= PS_MAX_CLOCK)
				return PS_EPROTO;
		char why[200];
		if (m->members && ps__members_repl_check(s, m->members, why, sizeof(why))) {
			ps_warn("replication: snapshot end with a membership this shard cannot "
				"hold: %s", why);
			return PS_EPROTO;
		}
		if (ntables) {
			for (int t = 0; t < ntables; t++)
				if (!(m->table_clocks[t] >= 0 && m->table_clocks[t] < 4e9)) {
					ps_warn("replication: snapshot with table %d at %g s since its "
						"epoch: out of range", t, m->table_clocks[t]);
					return PS_EPROTO;
				}
			int rc = ps__repl_tables_restore(s, m->table_clocks);
			if (rc)
				return rc;
		}
		if (ps__srv_stop_repl_apply(s, m->stop_at, m->stop_committed))
			return PS_EPROTO; /* a live re-shard's stop (stop.c) */
		memcpy(s->finished, m->finished, nw * sizeof(*s->finished));
		memcpy(s->dedup, f->payload, nw * sizeof(*s->dedup));
		int rc = ps__members_repl_apply(s, m->members, why, sizeof(why));
		if (rc) {
			ps_warn("replication: snapshot membership: %s", why);
			return rc;
		}
		r->lsn = m->lsn;
		r->epoch = m->epoch;
		ps__repl_staged_free(s, NULL, 0);
		*done = 1;
		return 0;
	}
	struct ps_slot *sl = ps_store_slot(&s->store, m->slice);
	if (!sl || m->which > (uint32_t)sl->opt->nstate ||
	    f->hdr.payload_len != (uint64_t)sl->slice->count * sizeof(float)) {
		ps_warn("replication: snapshot frame for slice %u array %u (%" PRIu64 " bytes) does "
			"not match this shard", m->slice, m->which, f->hdr.payload_len);
		return PS_EPROTO;
	}
	if (!f->payload_finite && !ps_words_finite(f->payload, (size_t)sl->slice->count)) {
		ps_warn("replication: snapshot frame for slice %u array %u holds NaN or infinite "
			"values", m->slice, m->which);
		return PS_EPROTO;
	}
	memcpy(m->which ? sl->state[m->which - 1] : sl->w, f->payload, f->hdr.payload_len);
	sl->version = m->version;
	sl->steps = m->steps;
	return 0;
}

int ps__repl_on_batch(struct ps_server *s, const Ps__ReplBatch *m, const struct ps_frame *f)
{
	struct ps_repl *r = s->repl;
	size_t nw = (size_t)s->cfg->nworkers;

	char why[200];

	if (m->lsn == r->lsn && !m->n_slots && !m->n_marks && !m->n_rows && !m->declare &&
	    !m->declare_tables && !m->members && !m->stop_set) {
		r->heartbeats++;
		return 0; /* a heartbeat */
	}
	if (m->lsn != r->lsn + 1) {
		ps_warn("replication: batch %" PRIu64 " after batch %" PRIu64 ": a gap", m->lsn,
			r->lsn);
		return PS_EPROTO;
	}
	if (m->n_finished && m->n_finished != nw)
		return PS_EPROTO;
	if (m->lsn >= PS_MAX_CLOCK || m->epoch >= PS_MAX_CLOCK) {
		ps_warn("replication: batch %" PRIu64 " of epoch %" PRIu64 ": out of range (at most "
			"2^53 - 1)", m->lsn, m->epoch);
		return PS_EPROTO;
	}
	if (m->declare || m->declare_tables) {
		/* first: the slices and tables of the rest may be declared here */
		int rc = ps__repl_decl_apply(s, m, f);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_slots; i++) {
		const Ps__ReplSlot *x = m->slots[i];
		struct ps_slot *sl = ps_store_slot(&s->store, x->slice);
		uint64_t n = sl ? (uint64_t)sl->slice->count : 0;

		if (x->has_lr && ps_optim_group_lr_check(0, x->lr, why, sizeof(why))) {
			ps_warn("replication: batch %" PRIu64 " applies slice %u with %s", m->lsn,
				x->slice, why);
			return PS_EPROTO;
		}
		if (x->version >= PS_MAX_CLOCK || x->steps >= PS_MAX_CLOCK) {
			ps_warn("replication: batch %" PRIu64 " sets slice %u to version %" PRIu64
				" and %" PRIu64 " steps: out of range (at most 2^53 - 1)", m->lsn,
				x->slice, x->version, x->steps);
			return PS_EPROTO;
		}
		if (sl && x->has_grad && x->length == n * sizeof(float) && !(x->offset % 4) &&
		    x->offset <= f->hdr.payload_len && x->length <= f->hdr.payload_len - x->offset &&
		    !f->payload_finite && !ps_words_finite(f->payload + x->offset, (size_t)n)) {
			ps_warn("replication: batch %" PRIu64 " holds NaN or infinite gradient values "
				"for slice %u", m->lsn, x->slice);
			return PS_EPROTO;
		}
	}
	for (size_t i = 0; i < m->n_marks; i++)
		if (m->marks[i]->rank < 0 || (size_t)m->marks[i]->rank >= nw || !m->marks[i]->seq)
			return PS_EPROTO;
	for (size_t i = 0; i < m->n_finished; i++)
		if (m->finished[i] >= PS_MAX_CLOCK)
			return PS_EPROTO;
	if (m->members && ps__members_repl_check(s, m->members, why, sizeof(why))) {
		ps_warn("replication: batch %" PRIu64 " holds a membership this shard cannot: %s",
			m->lsn, why);
		return PS_EPROTO;
	}
	if (m->n_rows) {
		int rc = ps__repl_rows_check(s, m, f);
		if (rc)
			return rc;
	}
	if (m->stop_set && (m->stop_at >= PS_MAX_CLOCK || (m->stop_committed && !m->stop_at)))
		return PS_EPROTO;
	for (size_t i = 0; i < m->n_slots; i++) {
		const Ps__ReplSlot *x = m->slots[i];
		struct ps_slot *sl = ps_store_slot(&s->store, x->slice);
		uint64_t n = sl ? (uint64_t)sl->slice->count : 0;

		if (!sl || (x->has_grad && (x->length != n * sizeof(float) || x->offset % 4 ||
					    x->offset > f->hdr.payload_len ||
					    x->length > f->hdr.payload_len - x->offset))) {
			ps_warn("replication: batch %" PRIu64 " names slice %u with %" PRIu64
				" bytes: not this shard's", m->lsn, x->slice, x->length);
			return PS_EPROTO;
		}
		if (x->staged) {
			int rc = stage(s, sl, x, f->payload + x->offset);
			if (rc)
				return rc;
			continue;
		}
		const float *g = x->has_grad ? (const float *)(f->payload + x->offset) : NULL;
		if (x->sum_staged && !(g = staged_sum(s, sl, x->version - 1))) {
			ps_warn("replication: batch %" PRIu64 " sums clock %" PRIu64 " of slice %u, "
				"of which no gradient came", m->lsn, x->version - 1, x->slice);
			return PS_EPROTO;
		}
		if (g) {
			/* the primary took step steps - 1 from where this slot is */
			if (x->steps != sl->steps + 1) {
				ps_warn("replication: slice %u is at step %" PRIu64 " here, the "
					"primary's step was %" PRIu64, x->slice, sl->steps, x->steps - 1);
				return PS_EPROTO;
			}
			double t0 = ps_now_s();
			struct ps_optim_cfg oc = *sl->ocfg;
			if (x->has_lr)
				oc.lr = x->lr;
			sl->opt->apply(&oc, sl->w, g, sl->state, (size_t)n, sl->steps);
			s->store.applies++;
			s->store.bytes_applied += n * sizeof(float);
			s->store.apply_seconds += ps_now_s() - t0;
		}
		sl->steps = x->steps;
		sl->version = x->version;
		if (s->repl->staged)
			ps__repl_staged_free(s, sl, sl->version);
	}
	if (m->n_rows) {
		int rc = ps__repl_rows_apply(s, m, f);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < m->n_finished; i++)
		s->finished[i] = m->finished[i];
	if (m->members) {
		int rc = ps__members_repl_apply(s, m->members, why, sizeof(why));
		if (rc)
			return rc; /* out of memory: checked above */
	}
	for (size_t i = 0; i < m->n_marks; i++) {
		const Ps__ReplMark *x = m->marks[i];
		ps_dedup_incarnation(&s->dedup[x->rank], x->incarnation);
		ps_dedup_mark(&s->dedup[x->rank], x->seq, 0);
	}
	if (m->stop_set)
		ps__srv_stop_repl_apply(s, m->stop_at, m->stop_committed); /* checked above */
	r->lsn = m->lsn;
	r->epoch = m->epoch > r->epoch ? m->epoch : r->epoch;
	r->batches++;
	r->bytes += f->hdr.payload_len;
	return 0;
}
