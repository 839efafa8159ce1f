/* members.c - elastic membership: which workers a shard counts at which
 * clock (docs/reliability.md, "Workers joining and leaving").
 *
 * A rank is a member of clock c when one of its intervals [from, to)
 * holds c. Ranks below cluster.initial_workers start with [0, inf); the
 * others have none until they join. Membership acts on the barrier
 * through the two per-rank arrays it already reads (store.c, rows.c,
 * pull.c): a rank is waited for at clock c when live[r] and finished[r]
 * <= c. So:
 *  - leave at L (the flag on the worker's push that ends clock L - 1):
 *    finished[r] is L already, and live[r] becomes 0 at once, so no clock
 *    from L on waits for it (no drop timeout);
 *  - join, in two steps the worker drives over every shard:
 *    HOLD: the shard answers P, its first clock not closed yet (the
 *    highest slice or table version, or the rank's own finished clock),
 *    and waits for the rank at P (finished[r] = P, live[r] = 1): no clock
 *    from P on can close without it;
 *    JOIN at J = max over shards of P, plus 1: finished[r] = J, so clocks
 *    below J close without it and J waits for it.
 *    Every shard held its P <= J - 1 before any of them was told J, so no
 *    shard closed clock J - 1 before it knew of the join: a worker that
 *    starts clock J (after version J from every shard) learns the members
 *    of J in its pull replies, and no worker has started J without them.
 *    Async: P is the slowest member's clock, at least the highest clock a
 *    pull was answered for; while a hold pends no pull for a clock past
 *    it is answered (ps__members_pull_cap), so no worker is told a clock
 *    from P + 1 on without the joiner, and the client joins at max P + 1
 *    (a join at P + s + 1 would be exact too, but puts the joiner s
 *    clocks ahead, and its pulls wait until every member passes P + 1:
 *    for ever when s is large and a member is slow).
 *  - a leave in async mode with s > 0 starts with FREEZE: F is the
 *    leaver's ended clock or the highest clock answered for a pull, if
 *    higher (those may have been told with it), raised by a second FREEZE
 *    to the highest F of every shard; until it leaves no pull of another
 *    worker past F is answered (ps__members_pull_cap), so no worker is
 *    told a later clock with it; the leaver trains up to F and leaves. (F
 *    + s, counting the leaver at F for the slowest-clock rule and letting
 *    the others run, was exact too, but beside a member that never ends a
 *    clock the others could run s clocks on, and the leaver with them: for
 *    ever when s is large.)
 * With checkpoint.dir set, the intervals are kept in a file beside the
 * checkpoint (shard-K.members), written before a join or leave is
 * answered: they are facts about clocks the whole cluster agreed on, not
 * state of this shard, so a shard restarted from an older checkpoint takes
 * all of them back, those after its checkpoint's clock included.
 * With cluster.replicas: 1 the primary sends the membership whole to its
 * backup in the replication batch after each change (a hold, a join, a
 * hold given up, a leave), in order with the slices' and rows' changes
 * (replica_log.c), and in the snapshot a new backup gets; the answer to a
 * join step waits, as a push's ack does, until the backup confirmed that
 * batch. So a backup that takes over has every change a worker was told
 * of, and a hold or a join the old primary had not got confirmed is one
 * the worker sends again (its request is resent after the reconnect).
 * Everything here runs on the shard's loop thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "members.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "replica.h"
#include "rows.h"
#include "server_int.h"

#define NONE UINT64_MAX

struct ivl {
	int rank;
	uint64_t from, to; /* member of clocks from..to-1; to NONE while open */
};

struct ps_members {
	int initial;       /* cluster.initial_workers */
	struct ivl *iv;
	int niv, cap;
	uint64_t *hold;    /* per rank: the clock a join holds, NONE when none */
	double *hold_at;   /* ... since when (a hold not followed by its join expires) */
	uint64_t joins, leaves;
	int dirty;         /* changed since the last replication batch */
	/* async: per rank, the clock a leave froze it at for the slowest-clock
	 * rule (NONE: none), and the highest clock a pull was answered for */
	uint64_t *freeze;
	uint64_t told;
};

static int add_ivl(struct ps_members *m, int rank, uint64_t from)
{
	if (m->niv == m->cap) {
		int cap = m->cap ? 2 * m->cap : 16;
		struct ivl *iv = realloc(m->iv, (size_t)cap * sizeof(*iv));

		if (!iv)
			return -ENOMEM;
		m->iv = iv;
		m->cap = cap;
	}
	m->iv[m->niv++] = (struct ivl){ rank, from, NONE };
	return 0;
}

/* The rank's open interval (a member now and on), or NULL. */
static struct ivl *open_ivl(const struct ps_members *m, int rank)
{
	for (int i = m->niv - 1; i >= 0; i--)
		if (m->iv[i].rank == rank)
			return m->iv[i].to == NONE ? &m->iv[i] : NULL;
	return NULL;
}

/* The membership file beside the checkpoint ("" when checkpoints are off). */
static void file_path(const struct ps_server *s, char *buf, size_t len)
{
	size_t n = strlen(s->ckpt_path);

	buf[0] = '\0';
	if (n > 5 && n + 4 < len && !strcmp(s->ckpt_path + n - 5, ".ckpt"))
		snprintf(buf, len, "%.*s.members", (int)(n - 5), s->ckpt_path);
}

/* Writes every interval (a temporary file renamed over the last one,
 * synced): "joins J leaves L" then one "rank from to" line each (to -1:
 * open). A failure is logged; the membership in memory stays right. */
static void save(const struct ps_server *s)
{
	const struct ps_members *m = s->members;
	char path[700], tmp[720];
	FILE *f;
	int ok;

	file_path(s, path, sizeof(path));
	if (!path[0])
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		ps_warn("cannot write %s: %s (a restart would forget the membership)", tmp,
			strerror(errno));
		return;
	}
	fprintf(f, "joins %" PRIu64 " leaves %" PRIu64 "\n", m->joins, m->leaves);
	for (int i = 0; i < m->niv; i++)
		fprintf(f, "%d %" PRIu64 " %" PRId64 "\n", m->iv[i].rank, m->iv[i].from,
			m->iv[i].to == NONE ? (int64_t)-1 : (int64_t)m->iv[i].to);
	ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok = fclose(f) == 0 && ok;
	if (!ok || rename(tmp, path)) {
		ps_warn("cannot write %s: %s (a restart would forget the membership)", path,
			strerror(errno));
		unlink(tmp);
	}
}

int ps__members_load(struct ps_server *s, char *err, size_t errlen)
{
	struct ps_members *m = s->members;
	char path[700], line[200];
	int nw = s->cfg->nworkers, ln = 1, rank;
	unsigned long long from;
	long long to;
	FILE *f;

	file_path(s, path, sizeof(path));
	if (!path[0] || !s->ckpt_loaded)
		return 0; /* a fresh start: the initial membership */
	f = fopen(path, "r");
	if (!f)
		return errno == ENOENT ? 0 : (snprintf(err, errlen, "%s: %s", path, strerror(errno)),
					      -errno);
	line[0] = '\0';
	if (!fgets(line, sizeof(line), f) || (line[strcspn(line, "\n")] = '\0') ||
	    sscanf(line, "joins %" SCNu64 " leaves %" SCNu64, &m->joins, &m->leaves) != 2)
		goto err_bad;
	m->niv = 0;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		ln++;
		if (sscanf(line, "%d %llu %lld", &rank, &from, &to) != 3 || rank < 0 || rank >= nw ||
		    from >= PS_MAX_CLOCK || to < -1 || (to >= 0 && (unsigned long long)to < from) ||
		    add_ivl(m, rank, from))
			goto err_bad;
		if (to >= 0)
			m->iv[m->niv - 1].to = (uint64_t)to;
	}
	fclose(f);
	/* who is waited for now: open members only, not before their joins */
	for (int r = 0; r < nw; r++) {
		struct ivl *v = open_ivl(m, r);

		s->live[r] = v != NULL;
		if (v && s->finished[r] < v->from)
			s->finished[r] = v->from;
	}
	ps_info("membership from %s: %" PRIu64 " joins, %" PRIu64 " leaves, epoch %" PRIu64
		" at clock %" PRIu64, path, m->joins, m->leaves,
		ps__members_epoch(s, ps__srv_resume_clock(s)), ps__srv_resume_clock(s));
	return 0;

err_bad:
	fclose(f);
	snprintf(err, errlen, "%s:%d: not a membership line (\"joins J leaves L\", then \"rank "
		 "from to\" with rank 0..%d and from <= to, to -1 when open): '%.60s'", path, ln,
		 nw - 1, line);
	return PS_ECONFIG;
}

int ps__members_init(struct ps_server *s)
{
	int nw = s->cfg->nworkers;
	struct ps_members *m = calloc(1, sizeof(*m));

	if (!m || !(m->hold = malloc((size_t)nw * sizeof(*m->hold))) ||
	    !(m->hold_at = calloc((size_t)nw, sizeof(*m->hold_at))) ||
	    !(m->freeze = malloc((size_t)nw * sizeof(*m->freeze))))
		goto err_free;
	m->initial = s->cfg->initial_workers > 0 && s->cfg->initial_workers < nw
			? s->cfg->initial_workers : nw;
	for (int r = 0; r < nw; r++) {
		m->hold[r] = NONE;
		m->freeze[r] = NONE;
		if (r < m->initial && add_ivl(m, r, 0))
			goto err_free;
		if (r >= m->initial)
			s->live[r] = 0; /* not waited for before it joins */
	}
	s->members = m;
	return 0;

err_free:
	if (m)
		free(m->hold), free(m->hold_at), free(m->freeze), free(m->iv);
	free(m);
	return -ENOMEM;
}

void ps__members_free(struct ps_server *s)
{
	if (!s->members)
		return;
	free(s->members->iv);
	free(s->members->hold);
	free(s->members->hold_at);
	free(s->members->freeze);
	free(s->members);
	s->members = NULL;
}

int ps__members_active(const struct ps_server *s)
{
	const struct ps_members *m = s->members;

	return m && (m->initial < s->cfg->nworkers || m->joins || m->leaves);
}

int ps__members_current(const struct ps_server *s, int rank)
{
	const struct ps_members *m = s->members;

	return !m || open_ivl(m, rank) || m->hold[rank] != NONE;
}

/* 1 when rank is a member of clock c; else 0 with why it is not in why. */
static int member_of(const struct ps_members *m, int rank, uint64_t c, char *why, size_t len)
{
	uint64_t last_to = NONE, next_from = NONE;

	for (int i = 0; i < m->niv; i++) {
		const struct ivl *v = &m->iv[i];
		if (v->rank != rank)
			continue;
		if (v->from <= c && (c < v->to || v->to == NONE))
			return 1; /* open: every later clock, UINT64_MAX too */
		if (v->to <= c)
			last_to = v->to;
		if (v->from > c && next_from == NONE)
			next_from = v->from;
	}
	if (next_from != NONE)
		snprintf(why, len, "worker %d is a member from clock %" PRIu64 " only (it joined "
			 "there), not at clock %" PRIu64, rank, next_from, c);
	else if (last_to != NONE)
		snprintf(why, len, "worker %d left the cluster at clock %" PRIu64 " (push at clock %"
			 PRIu64 "): it must join again first", rank, last_to, c);
	else if (m->hold[rank] != NONE)
		snprintf(why, len, "worker %d is joining (held at clock %" PRIu64 "): it pushes "
			 "once its join is done", rank, m->hold[rank]);
	else
		snprintf(why, len, "worker %d is not a member (cluster.initial_workers is %d): it "
			 "must join first", rank, m->initial);
	return 0;
}

int ps__members_check_push(struct ps_server *s, int rank, uint64_t clock, int end, int leave,
			   char *why, size_t len)
{
	if (!s->members)
		return 0;
	if (leave && !end) {
		snprintf(why, len, "a push that leaves must also end its clock (end_clock)");
		return PS_EPROTO;
	}
	return member_of(s->members, rank, clock, why, len) ? 0 : PS_EREFUSED;
}

/* The barriers and held pulls look again after live or finished changed. */
static void advance(struct ps_server *s)
{
	ps_store_advance(&s->store);
	ps__rows_advance(s);
	if (s->waiting)
		ps__srv_answer_pulls(s);
}

void ps__members_leave(struct ps_server *s, int rank, uint64_t clock)
{
	struct ivl *v = s->members ? open_ivl(s->members, rank) : NULL;

	if (!v)
		return; /* a resent leave, already applied */
	v->to = clock > v->from ? clock : v->from;
	s->members->leaves++;
	s->members->freeze[rank] = NONE;
	s->members->dirty = 1;
	s->live[rank] = 0;
	save(s);
	ps_info("worker %d left at clock %" PRIu64 " (it ended clock %" PRIu64 "); membership "
		"epoch %" PRIu64 " from clock %" PRIu64, rank, v->to, v->to - 1,
		ps__members_epoch(s, v->to), v->to);
	advance(s);
}

/* The shard's first clock not closed yet: the highest version of its
 * slices and tables (sync), or the slowest member's clock (async); at
 * least the rank's own finished clock. */
static uint64_t first_open(struct ps_server *s, int rank)
{
	uint64_t p = s->finished[rank];

	if (s->cfg->consistency == PS_SYNC) {
		Ps__Stats st = PS__STATS__INIT;

		for (int k = 0; k < s->store.nslots; k++)
			p = s->store.slots[k].version > p ? s->store.slots[k].version : p;
		if (!ps__rows_stats(s, &st, 0)) {
			for (size_t t = 0; t < st.n_tables; t++)
				p = st.tables[t]->version > p ? st.tables[t]->version : p;
			ps__rows_stats_free(&st);
		}
	} else {
		/* and at least the highest clock a pull was answered for: while
		 * the hold pends no pull past it is answered (ps__members_pull_cap),
		 * so no worker is told a clock from p + 1 on without the joiner */
		uint64_t slow = ps__srv_min_finished(s);
		p = slow > p ? slow : p;
		p = s->members->told > p ? s->members->told : p;
	}
	return p;
}

/* MEMBER_FREEZE: rank r (a member) is about to leave. The first asks
 * freeze it at F, its ended clock or, if higher, the highest clock this
 * shard answered a pull for: those clocks may have been told with r as a
 * member, so r trains up to there; until it leaves, no other worker's pull
 * past F is answered (ps__members_pull_cap), so no clock after F is told
 * with it. A FREEZE with member_clock `at` (the client's second round:
 * the highest F of every shard) raises F to it, never lowers it
 * (docs/reliability.md, "Data"). */
static void freeze(struct ps_server *s, int r, uint64_t at, Ps__Stats *st, char *err,
		   size_t errlen)
{
	struct ps_members *m = s->members;
	uint64_t f = s->finished[r];

	if (!open_ivl(m, r)) {
		st->member_status = PS_EREFUSED;
		snprintf(err, errlen, "worker %d is not a member: it has nothing to leave", r);
		return;
	}
	if (at >= PS_MAX_CLOCK) {
		st->member_status = PS_EPROTO;
		snprintf(err, errlen, "worker %d: a leave at clock %" PRIu64 ": out of range (at "
			 "most 2^53 - 1)", r, at);
		return;
	}
	if (m->freeze[r] == NONE) {
		f = m->told > f ? m->told : f;
		m->freeze[r] = at > f ? at : f;
		m->dirty = 1;
		ps_info("worker %d leaving: it trains up to clock %" PRIu64 "; until it leaves no "
			"other worker is told a later clock", r, m->freeze[r]);
	} else if (at > m->freeze[r]) {
		m->freeze[r] = at;
		m->dirty = 1;
		ps_info("worker %d leaving: it trains up to clock %" PRIu64 " (another shard's "
			"clock)", r, at);
	}
	st->member_clock = m->freeze[r];
}

/* HOLD, JOIN and FREEZE (StatsRequest.member_op); the answer goes in st. */
static void request(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *q,
		    Ps__Stats *st, char *err, size_t errlen)
{
	struct ps_members *m = s->members;
	int r = sc->rank;
	struct ivl *v;

	st->member_status = 0;
	if (r < 0) {
		st->member_status = PS_EREFUSED;
		snprintf(err, errlen, "only a worker may join or leave");
		return;
	}
	if (s->stop_at && ((q->member_op == PS__MEMBER_OP__MEMBER_HOLD && !open_ivl(m, r)) ||
			   (q->member_op == PS__MEMBER_OP__MEMBER_FREEZE && open_ivl(m, r)))) {
		/* not mixed into a re-shard's stop (stop.c): the client asks
		 * again once the stop is over (ps_client_members.c) */
		st->member_status = PS_ERESHARD;
		snprintf(err, errlen, "a re-shard is in progress: this shard stops at clock %" PRIu64
			 " (%s); worker %d %s after it", s->stop_at, s->stop_committed ?
			 "committed" : "prepared", r, q->member_op == PS__MEMBER_OP__MEMBER_HOLD ?
			 "joins" : "leaves");
		return;
	}
	if (q->member_op == PS__MEMBER_OP__MEMBER_FREEZE) {
		freeze(s, r, q->member_clock, st, err, errlen);
		return;
	}
	if ((v = open_ivl(m, r))) {
		st->member_status = 1; /* a member already: nothing to do */
		st->member_clock = v->from;
		return;
	}
	if (q->member_op == PS__MEMBER_OP__MEMBER_HOLD) {
		uint64_t p = first_open(s, r);

		m->hold[r] = p;
		m->hold_at[r] = ps_now_s();
		m->dirty = 1;
		s->finished[r] = p;
		ps__repl_note_finished(s, r);
		s->live[r] = 1;
		st->member_clock = p;
		ps_info("worker %d joining: held at clock %" PRIu64, r, p);
		return;
	}
	if (m->hold[r] == NONE || q->member_clock < m->hold[r] || q->member_clock >= PS_MAX_CLOCK) {
		st->member_status = PS_EPROTO;
		if (m->hold[r] == NONE)
			snprintf(err, errlen, "worker %d joins at clock %" PRIu64 " without a hold "
				 "on this shard (ask for one first)", r, q->member_clock);
		else if (q->member_clock >= PS_MAX_CLOCK)
			snprintf(err, errlen, "worker %d joins at clock %" PRIu64 ": out of range "
				 "(at most 2^53 - 1)", r, q->member_clock);
		else
			snprintf(err, errlen, "worker %d joins at clock %" PRIu64 ", below the "
				 "clock %" PRIu64 " this shard holds for it", r, q->member_clock,
				 m->hold[r]);
		return;
	}
	if (add_ivl(m, r, q->member_clock)) {
		st->member_status = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		return;
	}
	m->hold[r] = NONE;
	m->joins++;
	m->dirty = 1;
	save(s);
	s->finished[r] = q->member_clock;
	ps__repl_note_finished(s, r);
	s->live[r] = 1;
	st->member_clock = q->member_clock;
	ps_info("worker %d joined at clock %" PRIu64 "; membership epoch %" PRIu64 " from clock %"
		PRIu64, r, q->member_clock, ps__members_epoch(s, q->member_clock),
		q->member_clock);
	advance(s);
}

void ps__members_tick(struct ps_server *s, double now)
{
	struct ps_members *m = s->members;
	/* as long as a worker without a connection is waited for (conn.c) */
	double idle = s->cfg->limits.idle_timeout_ms / 1000.0;
	double limit = s->cfg->limits.drop_timeout_ms ? s->cfg->limits.drop_timeout_ms / 1000.0
		       : idle > 0 && idle < 5.0 ? idle : 5.0;
	int gone = 0;

	if (!ps__repl_serving(s))
		return; /* a backup's holds are its primary's to give up */
	for (int r = 0; m && r < s->cfg->nworkers; r++)
		if (m->hold[r] != NONE && limit > 0 && now - m->hold_at[r] > limit) {
			ps_warn("worker %d held clock %" PRIu64 " for %.1f s without joining "
				"(limits.drop_timeout_ms): the hold is given up and the clock goes "
				"on without it", r, m->hold[r], now - m->hold_at[r]);
			m->hold[r] = NONE;
			m->dirty = 1;
			s->live[r] = 0;
			gone = 1;
		}
	if (gone)
		advance(s);
}

uint64_t ps__members_pull_cap(const struct ps_server *s, int rank)
{
	const struct ps_members *m = s->members;
	uint64_t cap = UINT64_MAX;

	if (!m || s->cfg->consistency != PS_ASYNC)
		return cap;
	for (int r = 0; r < s->cfg->nworkers; r++) {
		if (m->hold[r] != NONE && m->hold[r] < cap)
			cap = m->hold[r];
		/* a leaver's own pulls go on to its last clock */
		if (r != rank && m->freeze[r] != NONE && m->freeze[r] < cap)
			cap = m->freeze[r];
	}
	return cap;
}

void ps__members_unfreeze(struct ps_server *s, int rank, const char *why)
{
	if (!s->members || s->members->freeze[rank] == NONE)
		return;
	ps_info("worker %d's leave (at clock %" PRIu64 ") given up: %s", rank,
		s->members->freeze[rank], why);
	s->members->freeze[rank] = NONE; /* no longer waited for */
	s->members->dirty = 1;
	if (s->waiting) /* pulls the freeze kept back (ps__members_pull_cap) */
		ps__srv_answer_pulls(s);
}

void ps__members_cancel(struct ps_server *s, int rank)
{
	ps__members_unfreeze(s, rank, "it went away");
	if (s->members && s->members->hold[rank] != NONE) {
		ps_info("worker %d's join (held at clock %" PRIu64 ") given up: it went away",
			rank, s->members->hold[rank]);
		s->members->hold[rank] = NONE;
		s->members->dirty = 1;
		if (s->waiting) /* pulls the hold kept back (ps__members_pull_cap) */
			ps__srv_answer_pulls(s);
	}
}

uint64_t ps__members_epoch(const struct ps_server *s, uint64_t c)
{
	const struct ps_members *m = s->members;
	uint64_t e = 0;

	for (int i = 0; m && i < m->niv; i++)
		e += (m->iv[i].from > 0 && m->iv[i].from <= c) + (m->iv[i].to <= c);
	return e;
}

/* Ranks that are members of clock c, ascending, into out (nworkers
 * entries); returns how many. */
static size_t members_at(const struct ps_server *s, uint64_t c, int32_t *out)
{
	size_t n = 0;

	for (int r = 0; r < s->cfg->nworkers; r++)
		for (int i = 0; i < s->members->niv; i++) {
			const struct ivl *v = &s->members->iv[i];
			if (v->rank == r && v->from <= c && c < v->to) {
				out[n++] = r;
				break;
			}
		}
	return n;
}

/* Sum over clocks 0..c-1 of each clock's member count. */
static uint64_t member_clocks_before(const struct ps_members *m, uint64_t c)
{
	uint64_t n = 0;

	for (int i = 0; i < m->niv; i++)
		if (m->iv[i].from < c)
			n += (m->iv[i].to < c ? m->iv[i].to : c) - m->iv[i].from;
	return n;
}

int ps__members_fill_pull(const struct ps_server *s, uint64_t clock, Ps__PullReply *r)
{
	if (!ps__members_active(s))
		return 0;
	r->members = malloc((size_t)s->cfg->nworkers * sizeof(*r->members));
	if (!r->members)
		return -ENOMEM;
	r->has_members = 1;
	r->member_clock = clock;
	r->member_epoch = ps__members_epoch(s, clock);
	r->n_members = members_at(s, clock, r->members);
	r->member_before = member_clocks_before(s->members, clock);
	return 0;
}

int ps__members_pending(const struct ps_server *s, char *why, size_t len)
{
	const struct ps_members *m = s->members;

	for (int r = 0; m && r < s->cfg->nworkers; r++) {
		if (m->hold[r] != NONE) {
			snprintf(why, len, "worker %d is joining at clock %" PRIu64 " (it holds that "
				 "clock on shard %d): try again after it", r, m->hold[r] + 1, s->shard);
			return 1;
		}
		if (m->freeze[r] != NONE) {
			snprintf(why, len, "worker %d is leaving (it trains up to clock %" PRIu64 " on shard "
				 "%d until it leaves): try again after it", r, m->freeze[r], s->shard);
			return 1;
		}
	}
	return 0;
}

int ps__members_stats(struct ps_server *s, struct ps_srv_conn *sc, const Ps__StatsRequest *q,
		      Ps__Stats *st, char *err, size_t errlen)
{
	const struct ps_members *m = s->members;
	uint64_t cur = ps__srv_resume_clock(s);
	size_t nw = (size_t)s->cfg->nworkers;
	uint64_t *clk;

	err[0] = '\0';
	if (q && q->member_op != PS__MEMBER_OP__MEMBER_NONE)
		request(s, sc, q, st, err, errlen);
	st->member_error = err;
	/* one block, freed as st->members: the members, the joining and
	 * leaving ranks, then their clocks */
	st->members = malloc(nw * 3 * sizeof(int32_t) + 8 + nw * 2 * sizeof(uint64_t));
	if (!st->members)
		return -ENOMEM;
	st->joining = st->members + nw;
	st->leaving = st->joining + nw;
	clk = (uint64_t *)((char *)st->members + ((nw * 3 * sizeof(int32_t) + 7) & ~(size_t)7));
	st->joining_clock = clk;
	st->leaving_clock = clk + nw;
	for (size_t r = 0; r < nw; r++) {
		if (m->hold[r] != NONE) {
			st->joining[st->n_joining] = (int32_t)r;
			st->joining_clock[st->n_joining++] = m->hold[r] + 1;
		}
		if (m->freeze[r] != NONE) {
			st->leaving[st->n_leaving] = (int32_t)r;
			st->leaving_clock[st->n_leaving++] = m->freeze[r];
		}
	}
	st->n_joining_clock = st->n_joining;
	st->n_leaving_clock = st->n_leaving;
	st->n_members = members_at(s, cur, st->members);
	st->member_current = cur;
	st->member_epoch = ps__members_epoch(s, cur);
	st->joins = s->members->joins;
	st->leaves = s->members->leaves;
	return 0;
}

void ps__members_counts(const struct ps_server *s, uint64_t *joins, uint64_t *leaves)
{
	*joins = s->members ? s->members->joins : 0;
	*leaves = s->members ? s->members->leaves : 0;
}

/* ---- replication (cluster.replicas: 1) ---- */

int ps__members_repl_dirty(const struct ps_server *s)
{
	return s->members && s->members->dirty;
}

int ps__members_repl_fill(struct ps_server *s, Ps__ReplMembers *out)
{
	struct ps_members *m = s->members;
	int nw = s->cfg->nworkers;
	size_t n = (size_t)m->niv;
	/* one block: the pointers, then the intervals they point to */
	Ps__ReplMember **ip = malloc((n + 1) * (sizeof(*ip) + sizeof(**ip)));
	Ps__ReplMember *iv = ip ? (Ps__ReplMember *)(ip + n + 1) : NULL;
	uint64_t *hold = calloc(2 * (size_t)nw, sizeof(*hold)); /* then the freezes */

	ps__repl_members__init(out);
	if (!ip || !hold) {
		free(ip);
		free(hold);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		ps__repl_member__init(&iv[i]);
		iv[i].rank = m->iv[i].rank;
		iv[i].from = m->iv[i].from;
		iv[i].open = m->iv[i].to == NONE;
		iv[i].to = iv[i].open ? 0 : m->iv[i].to;
		ip[i] = &iv[i];
	}
	for (int r = 0; r < nw; r++) {
		hold[r] = m->hold[r] == NONE ? 0 : m->hold[r] + 1;
		hold[nw + r] = m->freeze[r] == NONE ? 0 : m->freeze[r] + 1;
	}
	out->n_freeze = (size_t)nw;
	out->freeze = hold + nw;
	out->n_intervals = n;
	out->intervals = ip;
	out->n_hold = (size_t)nw;
	out->hold = hold;
	out->joins = m->joins;
	out->leaves = m->leaves;
	out->map_epoch = s->map_epoch; /* not membership, but sent with it: the snapshot */
	m->dirty = 0;
	return 0;
}

void ps__members_repl_fill_free(Ps__ReplMembers *out)
{
	free(out->intervals);
	free(out->hold); /* the freezes too */
	out->intervals = NULL;
	out->hold = NULL;
	out->freeze = NULL;
}

int ps__members_repl_check(const struct ps_server *s, const Ps__ReplMembers *m, char *why,
			   size_t len)
{
	int nw = s->cfg->nworkers;

	if (m->n_hold != (size_t)nw) {
		snprintf(why, len, "%zu holds for %d workers", m->n_hold, nw);
		return 1;
	}
	if (m->joins >= PS_MAX_CLOCK || m->leaves >= PS_MAX_CLOCK || m->map_epoch >= PS_MAX_CLOCK) {
		snprintf(why, len, "%" PRIu64 " joins and %" PRIu64 " leaves, map epoch %" PRIu64
			 ": out of range", m->joins, m->leaves, m->map_epoch);
		return 1;
	}
	if (m->n_freeze && m->n_freeze != (size_t)nw) {
		snprintf(why, len, "%zu leave clocks for %d workers", m->n_freeze, nw);
		return 1;
	}
	for (int r = 0; r < nw; r++)
		if (m->hold[r] > PS_MAX_CLOCK || (m->n_freeze && m->freeze[r] > PS_MAX_CLOCK)) {
			snprintf(why, len, "worker %d held at %" PRIu64 " or frozen at %" PRIu64
				 ": out of range", r, m->hold[r] - 1,
				 m->n_freeze ? m->freeze[r] - 1 : 0);
			return 1;
		}
	for (size_t i = 0; i < m->n_intervals; i++) {
		const Ps__ReplMember *v = m->intervals[i];
		if (v->rank < 0 || v->rank >= nw || v->from >= PS_MAX_CLOCK ||
		    (!v->open && (v->to < v->from || v->to >= PS_MAX_CLOCK))) {
			snprintf(why, len, "interval %zu: worker %d, clocks %" PRIu64 "..%s%" PRIu64
				 " (workers 0..%d, from <= to < 2^53)", i, v->rank, v->from,
				 v->open ? "open " : "", v->to, nw - 1);
			return 1;
		}
	}
	return 0;
}

int ps__members_repl_apply(struct ps_server *s, const Ps__ReplMembers *m, char *why, size_t len)
{
	struct ps_members *mb = s->members;
	int nw = s->cfg->nworkers;
	double now = ps_now_s();

	if (!m) {
		/* a snapshot without it: the initial membership (no change) */
		static const Ps__ReplMembers none = PS__REPL_MEMBERS__INIT;
		uint64_t *hold = calloc((size_t)nw, sizeof(*hold));
		Ps__ReplMember *iv = calloc((size_t)mb->initial + 1, sizeof(*iv));
		Ps__ReplMember **ip = calloc((size_t)mb->initial + 1, sizeof(*ip));
		Ps__ReplMembers init = none;
		int rc = -ENOMEM;

		if (hold && iv && ip) {
			for (int r = 0; r < mb->initial; r++) {
				ps__repl_member__init(&iv[r]);
				iv[r].rank = r;
				iv[r].open = 1;
				ip[r] = &iv[r];
			}
			init.n_intervals = (size_t)mb->initial;
			init.intervals = ip;
			init.n_hold = (size_t)nw;
			init.hold = hold;
			rc = ps__members_repl_apply(s, &init, why, len);
		} else {
			snprintf(why, len, "out of memory");
		}
		free(hold);
		free(iv);
		free(ip);
		return rc;
	}
	if (ps__members_repl_check(s, m, why, len))
		return PS_EPROTO;
	if (m->n_intervals > (size_t)mb->cap) {
		struct ivl *iv = realloc(mb->iv, m->n_intervals * sizeof(*iv));
		if (!iv) {
			snprintf(why, len, "out of memory");
			return -ENOMEM;
		}
		mb->iv = iv;
		mb->cap = (int)m->n_intervals;
	}
	mb->niv = (int)m->n_intervals;
	for (int i = 0; i < mb->niv; i++) {
		const Ps__ReplMember *v = m->intervals[i];
		mb->iv[i] = (struct ivl){ v->rank, v->from, v->open ? NONE : v->to };
	}
	mb->joins = m->joins;
	mb->leaves = m->leaves;
	s->map_epoch = m->map_epoch;
	/* who the primary waits for: the same once this process serves */
	for (int r = 0; r < nw; r++) {
		struct ivl *v = open_ivl(mb, r);
		uint64_t h = m->hold[r] ? m->hold[r] - 1 : NONE;

		if (h != NONE && mb->hold[r] != h)
			mb->hold_at[r] = now;
		mb->hold[r] = h;
		mb->freeze[r] = m->n_freeze && m->freeze[r] ? m->freeze[r] - 1 : NONE;
		s->live[r] = v || h != NONE;
		if (v && s->finished[r] < v->from)
			s->finished[r] = v->from;
		if (h != NONE && s->finished[r] < h)
			s->finished[r] = h;
	}
	save(s);
	return 0;
}

void ps__members_takeover(struct ps_server *s, double now)
{
	struct ps_members *m = s->members;

	for (int r = 0; m && r < s->cfg->nworkers; r++) {
		s->live[r] = ps__members_current(s, r);
		if (m->hold[r] != NONE)
			m->hold_at[r] = now; /* the joiner's requests come again: give it time */
	}
}

void ps__members_told(struct ps_server *s, uint64_t clock)
{
	if (s->members && clock > s->members->told)
		s->members->told = clock;
}

uint64_t ps__members_counted(const struct ps_server *s, int rank)
{
	const struct ps_members *m = s->members;

	return m && m->freeze[rank] < s->finished[rank] ? m->freeze[rank] : s->finished[rank];
}
