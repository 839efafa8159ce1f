/* ps_stat_reshard.c - ps-stat --reshard-stop: every shard stops at one
 * clock B for a live re-shard (server/stop.c, docs/elastic.md); and
 * --reshard-cancel, which takes such a stop back.
 *
 * B is the highest clock any shard took a push for, plus one, or the
 * highest clock a worker finished there if higher; a shard that took a
 * push for B meanwhile refuses, and every shard is asked again with B + 1
 * at once (the shards that accepted raise their stop). Once all accepted
 * one B, each is told to commit: it closes the clocks below B, writes its
 * checkpoint and exits. Refused first while another stop or a join or
 * leave is under way (refusals).
 *
 * Declarations at run time: a worker's declaration of tensors or tables
 * reaches the shards one by one, and a shard holding a stop refuses one
 * that would create them, so a declaration can be taken by a shard before
 * its stop and refused by another after its own. Committed so, the old
 * checkpoints would differ in what they declare, which the new shards
 * refuse (and the shard that took it waited at its commit forever: its
 * new slices at version 0, behind the stop's clock). A shard holding a
 * stop it has not committed declares nothing new, so what each declares
 * in its answer to the stop (Stats.decl_digest) holds until its commit or
 * a cancel: when the answers differ the stops are cancelled, the refused
 * shards take the declaration when its worker asks again (every 20 ms),
 * and once every shard declares the same the stop is asked again; only
 * answers that agree are committed, each commit carrying their digest (a
 * shard whose declarations changed since, its stop cancelled by someone
 * else, refuses it). A declaration that does not reach every shard within
 * DECL_WAIT_S (its worker ended while declaring) refuses the re-shard,
 * the shards taking pushes again. A stop committed on some shards only (a
 * ps-stat that died between its commits) is committed on the others
 * without the digest: the ps-stat that committed it compared them, and a
 * committed shard takes the declaration of a worker the stop waits for
 * (server/stop.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ps_client_int.h" /* ps__client_stats_clocks, ps__client_stop_commit */
#include "ps_err.h"
#include "ps_stat_reshard.h"
#include "ps_time.h"

/* How long a declaration that reached some shards only may take to reach
 * the others (its worker asks again every 20 ms) before the stop is
 * refused; and how many times the shards may be found differing (tensors,
 * then tables, is two). */
#define DECL_WAIT_S 3.0
#define DECL_ROUNDS 4

/* What one shard declares (its Stats). */
struct decl {
	uint64_t digest;
	int tensors, tables;
};

static void decl_of(const struct ps_shard_stats *st, struct decl *d)
{
	d->digest = st->decl_digest;
	d->tensors = st->decl_tensors;
	d->tables = st->decl_tables;
}

/* The first shard whose declarations differ from shard 0's, or -1. */
static int decl_differs(const struct decl *d, int n)
{
	for (int k = 1; k < n; k++)
		if (d[k].digest != d[0].digest)
			return k;
	return -1;
}

/* Sleeps s seconds unless a signal stops us first. */
static void nap(double s, volatile sig_atomic_t *stop)
{
	double until = ps_now_s() + s;

	while (!*stop && ps_now_s() < until) {
		double left = until - ps_now_s();
		struct timespec ts = { .tv_sec = (time_t)left,
				       .tv_nsec = (long)((left - (double)(time_t)left) * 1e9) };
		nanosleep(&ts, NULL);
	}
}

/* Before a stop: the changes under way that refuse it (docs/elastic.md,
 * "Operations"). Another re-shard's stop on any shard: committed on some
 * (a ps-stat that died or failed between its commits), its clock goes
 * into *finish, to commit the others at it; prepared only, refused. A worker's join or leave under
 * way: refused (the shard would refuse it too). 0 to go on, 1 refused
 * (said on stderr). */
static int refusals(const struct ps_config *cfg, struct ps_client *c, struct ps_shard_stats *st,
		    uint64_t *finish)
{
	int held = -1, committed = -1;
	uint64_t held_at = 0;

	*finish = 0;
	for (int k = 0; k < cfg->nshards; k++) {
		if (ps__client_stats_clocks(c, k, st)) {
			fprintf(stderr, "ps-stat: reshard-stop: %s\n", ps_client_error(c));
			return 1;
		}
		if (st->stop_at && st->stop_committed && committed < 0) {
			committed = k;
			*finish = st->stop_at;
		} else if (st->stop_at && held < 0) {
			held = k;
			held_at = st->stop_at;
		}
		if (!st->stop_at && (st->njoining || st->nleaving)) {
			if (st->njoining)
				fprintf(stderr, "ps-stat: reshard-stop: refused: worker %d is joining at "
					"clock %" PRIu64 " (shard %d holds it); try again after it\n",
					st->joining[0], st->joining_clock[0], k);
			else
				fprintf(stderr, "ps-stat: reshard-stop: refused: worker %d is leaving "
					"(shard %d counts it at clock %" PRIu64 " until it leaves); try "
					"again after it\n", st->leaving[0], k, st->leaving_clock[0]);
			return 1;
		}
	}
	if (committed >= 0) {
		printf("ps-stat: reshard-stop: shard %d committed to stop at clock %" PRIu64
		       " already (an earlier stop not finished): committing every shard at it\n",
		       committed, *finish);
		return 0;
	}
	if (held >= 0) {
		fprintf(stderr, "ps-stat: reshard-stop: refused: another re-shard is in progress: "
			"shard %d holds a stop at clock %" PRIu64 " (prepared); if none runs (its "
			"ps-stat died), cancel it with ps-stat --config FILE --reshard-cancel\n", held,
			held_at);
		return 1;
	}
	return 0;
}

/* One clock every shard accepts to stop at: the clocks read once (a Stats
 * answer checksums every table: seconds with millions of rows), every
 * shard asked to stop at b; a shard that refuses b took a push for it, so
 * b + 1 is tried next, at once (the shards that accepted b hold the
 * workers there meanwhile). 0 with the clock in *finish and each shard's
 * declarations in its answer in d; -1 with the reason in err (the stops
 * made marked in mine). */
static int prepare(const struct ps_config *cfg, struct ps_client *c, struct ps_shard_stats *st,
		   unsigned char *mine, struct decl *d, uint64_t *finish,
		   volatile sig_atomic_t *stop, char *err, size_t errlen)
{
	uint64_t b = 1;
	int k;

	for (int tries = 0; tries < 200 && !*stop; tries++) {
		for (k = 0; !tries && k < cfg->nshards; k++) {
			if (ps__client_stats_clocks(c, k, st))
				goto err_client;
			if (st->top_clock > b)
				b = st->top_clock;
			/* a shard that took no push since it started (from a
			 * checkpoint) is at its workers' finished clocks */
			for (int r = 0; r < st->nworkers && r < 64; r++)
				if (st->worker_clock[r] > b)
					b = st->worker_clock[r];
		}
		for (k = 0; k < cfg->nshards; k++) {
			int r = ps_client_stop_at(c, k, b, 0, st);
			if (r == PS_ECLOCK)
				break; /* a push for b came: again with a later b */
			if (r)
				goto err_client;
			mine[k] = 1;
			decl_of(st, &d[k]);
		}
		if (k == cfg->nshards) {
			*finish = b;
			return 0;
		}
		b++;
	}
	snprintf(err, errlen, "no clock every shard accepted after 200 tries");
	return -1;
err_client:
	snprintf(err, errlen, "%s", ps_client_error(c));
	return -1;
}

/* The stops this run made cancelled (a shard that fails it is named). */
static void cancel_mine(const struct ps_config *cfg, struct ps_client *c,
			struct ps_shard_stats *st, unsigned char *mine)
{
	for (int k = 0; k < cfg->nshards; k++)
		if (mine[k] && ps_client_stop_at(c, k, 0, PS_STOP_CANCEL, st))
			fprintf(stderr, "ps-stat: reshard-stop: shard %d: cancelling its stop: %s\n",
				k, ps_client_error(c));
	memset(mine, 0, (size_t)cfg->nshards);
}

/* Waits (DECL_WAIT_S at most) until every shard declares the same, read
 * into d. 0 once they do, -1 when they still differ, -2 when a shard did
 * not answer (said on stderr). */
static int wait_decl(const struct ps_config *cfg, struct ps_client *c, struct ps_shard_stats *st,
		     struct decl *d, volatile sig_atomic_t *stop)
{
	double until = ps_now_s() + DECL_WAIT_S;

	for (;;) {
		for (int k = 0; k < cfg->nshards; k++) {
			if (ps__client_stats_clocks(c, k, st)) {
				fprintf(stderr, "ps-stat: reshard-stop: %s\n", ps_client_error(c));
				return -2;
			}
			decl_of(st, &d[k]);
		}
		if (decl_differs(d, cfg->nshards) < 0)
			return 0;
		if (*stop || ps_now_s() > until)
			return -1;
		nap(0.05, stop);
	}
}

int ps__stat_reshard(const struct ps_config *cfg, struct ps_client **cp, int cancel,
		     volatile sig_atomic_t *stop)
{
	struct ps_shard_stats *st = malloc(sizeof(*st));
	unsigned char *mine = calloc((size_t)cfg->nshards, 1); /* stops this run made */
	struct decl *d = calloc((size_t)cfg->nshards, sizeof(*d));
	struct decl agreed = { 0 };
	char err[512];
	int rc = 1, k = 0, check = 0;
	uint64_t finish = 0;

	if (!st || !mine || !d)
		goto out_free;
	if (ps_client_init(cp, cfg, -1, err, sizeof(err))) {
		fprintf(stderr, "ps-stat: %s\n", err);
		goto out_free;
	}
	for (k = 0; k < cfg->nshards; k++)
		if (ps_client_shard_error(*cp, k, err, sizeof(err))) {
			fprintf(stderr, "ps-stat: reshard-%s: %s: every shard must be up\n",
				cancel ? "cancel" : "stop", err);
			goto out_free;
		}
	if (cancel) {
		rc = 0;
		for (k = 0; k < cfg->nshards; k++) {
			if (ps_client_stop_at(*cp, k, 0, PS_STOP_CANCEL, st)) {
				fprintf(stderr, "ps-stat: reshard-cancel: %s\n", ps_client_error(*cp));
				rc = 1;
			} else {
				printf("ps-stat: reshard-cancel: shard %d takes pushes again\n", k);
			}
		}
		goto out_free;
	}
	/* a stop committed on some shards already (finish) is committed on
	 * the others unchecked: the ps-stat that committed it compared them,
	 * and a committed shard may have taken a declaration since (stop.c) */
	if (refusals(cfg, *cp, st, &finish))
		goto out_free;
	for (int round = 0; !finish; round++) {
		int w;

		if (prepare(cfg, *cp, st, mine, d, &finish, stop, err, sizeof(err)))
			goto err_cancel;
		k = decl_differs(d, cfg->nshards);
		if (k < 0) {
			agreed = d[0];
			check = 1;
			break;
		}
		/* a declaration taken by some shards before their stop and
		 * refused by the others after theirs: completed first */
		cancel_mine(cfg, *cp, st, mine);
		finish = 0;
		printf("ps-stat: reshard-stop: shard 0 declares %d tensor(s) and %d table(s), shard "
		       "%d %d and %d: a declaration reached some shards before their stop and not "
		       "the others; the stops cancelled, waiting up to %.0f s for it to reach "
		       "every shard\n", d[0].tensors, d[0].tables, k, d[k].tensors, d[k].tables,
		       DECL_WAIT_S);
		fflush(stdout);
		w = round + 1 < DECL_ROUNDS ? wait_decl(cfg, *cp, st, d, stop) : -1;
		if (w == -2)
			goto out_free;
		if (w) {
			k = decl_differs(d, cfg->nshards);
			fprintf(stderr, "ps-stat: reshard-stop: refused: a declaration of tensors or "
				"tables reached some shards only and not the others within %.0f s "
				"(shard 0 declares %d tensor(s) and %d table(s), shard %d %d and %d): "
				"did its worker end while declaring? (a worker declaring again "
				"completes it); the shards take pushes again: try again once it is "
				"complete\n", DECL_WAIT_S, d[0].tensors, d[0].tables, k < 0 ? 0 : k,
				k < 0 ? 0 : d[k].tensors, k < 0 ? 0 : d[k].tables);
			goto out_free;
		}
	}
	for (k = 0; k < cfg->nshards; k++)
		if (check ? ps__client_stop_commit(*cp, k, finish, agreed.digest, st)
			  : ps_client_stop_at(*cp, k, finish, PS_STOP_COMMIT, st)) {
			fprintf(stderr, "ps-stat: reshard-stop: shard %d: %s; shards 0..%d were "
				"told to stop at clock %" PRIu64 " and will: run this again to "
				"commit the others at the same clock\n", k, ps_client_error(*cp),
				k - 1, finish);
			goto out_free;
		}
	printf("ps-stat: reshard-stop: every shard stops at clock %" PRIu64 ": it closes "
	       "the clocks below, writes its checkpoint there and exits\n", finish);
	rc = 0;
	goto out_free;
err_cancel:
	fprintf(stderr, "ps-stat: reshard-stop: %s; cancelling the stop\n", err);
	cancel_mine(cfg, *cp, st, mine);
out_free:
	free(d);
	free(mine);
	free(st);
	return rc;
}
