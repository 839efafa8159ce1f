/* ps_stat.c - ps-stat: one table of every shard's push/pull statistics.
 *
 * A monitor client (rank -1, role STAT in the handshake) asks each shard
 * for its counters twice, --interval seconds apart (or every --watch
 * seconds), and prints rates over that interval: requests/s, MB/s in and
 * out as float32 (raw) and as sent (wire), push and pull latency p50/p99
 * from the difference of the shards' log2 histograms, the slowest and
 * fastest worker clock and the gap between them, the share of time the
 * optimizer ran, rejected frames and connections; the membership and, once
 * re-sharded or while a change is under way, each shard's map epoch and
 * the change in progress. --reshard-stop and --reshard-cancel stop the
 * shards for a live re-shard (ps_stat_reshard.c) or take such a stop back. A
 * shard that cannot be reached is shown as down with the reason; the rest
 * still print.
 *
 * Exit status: 0 when every shard answered, 1 when one was down, 2 for a
 * usage or config error.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ps_time.h"
#include "auth.h"
#include "config.h"
#include "histo.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_stat_reshard.h"
#include "version.h"

struct opts {
	const char *config;
	const char *secret; /* --secret-file */
	double watch;       /* seconds between refreshes; 0 = once */
	double interval;    /* once: seconds between the two samples */
	int json, workers, checkpoint, reshard_stop;
};

/* One shard at one moment. */
struct snap {
	int up;
	char why[512];
	struct ps_shard_stats st;
	/* cluster.replicas: 1: each of the two processes (st is the primary's) */
	int rep_up[2];
	struct ps_shard_stats rep[2];
};

/* cluster.replicas: 1: the config with the backups' addresses as the
 * servers, and a monitor connection to them */
static struct ps_config *bcfg;
static struct ps_client *bclient;

/* Rates of one shard (or the totals) over an interval. */
struct row {
	int up;
	double uptime_s;
	double push_s, pull_s, in_raw, in_wire, out_raw, out_wire; /* per second; MB/s */
	double push_p50, push_p99, pull_p50, pull_p99;              /* seconds, NAN if none */
	uint64_t push_lat[PS_HISTO_BUCKETS], pull_lat[PS_HISTO_BUCKETS];
	uint64_t clk_min, clk_max;
	int have_clock;
	double apply_share;                                         /* 0..1 */
	uint64_t rejected, errors, auth_failures, dups;
	unsigned conns, workers_up, nworkers;
	/* checkpoint.dir set: age of the last good checkpoint, failures, and
	 * stale: older than twice checkpoint.every_s (the totals: any shard) */
	int ckpt_on, ckpt_stale;
	double ckpt_age;
	uint64_t ckpt_failures;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: ps-stat --config FILE [--watch SECONDS] [--json] [--workers]\n"
		"\n"
		"Asks every shard of FILE for its statistics and prints one row per shard\n"
		"and a totals row: up/down, uptime, pushes/s and pulls/s, MB/s in (pushed\n"
		"gradients) and out (pulled weights) as float32 and as sent on the wire,\n"
		"push and pull latency p50/p99 at the shard (pull latency includes the wait\n"
		"for the consistency condition), slowest and fastest worker clock and the\n"
		"gap between them out of the most the consistency mode allows (sync 1,\n"
		"async staleness + 1: clocks are counted when finished), share of time\n"
		"spent applying the optimizer,\n"
		"rejected frames and connections; with workers joining or leaving (an\n"
		"elastic cluster), each shard's membership epoch, members and joins and\n"
		"leaves; once re-sharded or while a change is under way, each shard's map\n"
		"epoch, what moved in at its start and the change in progress (a re-shard's\n"
		"stop, a join, a leave). Rates cover the interval between two\n"
		"samples. A shard that cannot be reached shows as down with the reason.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE     cluster configuration (YAML), required\n"
		"  -w, --watch SECONDS   refresh every SECONDS, redrawing in place like top\n"
		"                        (Ctrl-C stops); without it, print once\n"
		"  -i, --interval S      once: seconds between the two samples (default 1)\n"
		"  -j, --json            one JSON object per refresh instead of the table\n"
		"  -W, --workers         also one row per worker: its clock on each shard\n"
		"      --secret-file F   the cluster secret (default: the config's\n"
		"                        security.secret_file, else $PS_SECRET_FILE)\n"
		"  -C, --checkpoint      ask every shard to write its checkpoint now\n"
		"                        (config checkpoint.dir; the shards must have\n"
		"                        checkpoint.on_request: true) and report each file\n"
		"      --reshard-stop    stop every shard at one clock boundary for a re-shard\n"
		"                        while the workers run (docs/elastic.md): each\n"
		"                        refuses pushes from that clock on (the workers keep\n"
		"                        them), closes the clocks below, writes its checkpoint\n"
		"                        there and exits 0; prints the clock. Refused while\n"
		"                        another stop or a worker's join or leave is under way\n"
		"      --reshard-cancel  cancel every shard's re-shard stop not committed yet\n"
		"                        (one a ps-stat that died left)\n"
		"  -h, --help            this text\n"
		"      --version         version, wire protocol, rdma and CUDA plug-in of this build\n"
		"\n"
		"Exit status: 0 when every shard answered (and, with --checkpoint, wrote\n"
		"its file), 1 when any was down or failed, 2 for a usage or\n"
		"configuration error.\n");
}

static int parse_seconds(const char *flag, const char *s, double lo, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v >= lo && v <= 86400)) {
		fprintf(stderr, "ps-stat: %s: expected seconds in [%g, 86400], got '%s'\n", flag,
			lo, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* Samples every shard; reconnects first when a shard was down. */
static void sample_one(const struct ps_config *cfg, struct ps_client **cp, struct snap *s);

static void sample(const struct ps_config *cfg, struct ps_client **cp, struct snap *s)
{
	struct snap *b;

	sample_one(cfg, cp, s);
	if (!cfg->replicas)
		return;
	/* the backups' addresses too; the primary's counters fill the row */
	if (!bcfg && (bcfg = malloc(sizeof(*bcfg)))) {
		memcpy(bcfg, cfg, sizeof(*bcfg));
		memcpy(bcfg->shards, cfg->backups, sizeof(bcfg->shards));
	}
	b = calloc((size_t)cfg->nshards, sizeof(*b));
	if (!bcfg || !b) {
		free(b);
		return;
	}
	sample_one(bcfg, &bclient, b);
	for (int k = 0; k < cfg->nshards; k++) {
		s[k].rep_up[0] = s[k].up;
		s[k].rep[0] = s[k].st;
		s[k].rep_up[1] = b[k].up;
		s[k].rep[1] = b[k].st;
		if (b[k].up && b[k].st.repl_state == 3 && !(s[k].up && s[k].st.repl_state == 3)) {
			s[k].up = 1;
			s[k].st = b[k].st;
		}
	}
	free(b);
}

static void sample_one(const struct ps_config *cfg, struct ps_client **cp, struct snap *s)
{
	char err[512];
	int any_down = 0;

	for (int k = 0; k < cfg->nshards && *cp; k++)
		any_down |= ps_client_shard_error(*cp, k, err, sizeof(err)) != NULL;
	if (any_down || !*cp) {
		ps_client_free(*cp);
		*cp = NULL;
		if (ps_client_init(cp, cfg, -1, err, sizeof(err)))
			*cp = NULL;
	}
	for (int k = 0; k < cfg->nshards; k++) {
		struct snap *x = &s[k];
		const char *why;

		memset(x, 0, sizeof(*x));
		if (!*cp) {
			snprintf(x->why, sizeof(x->why), "%s", err);
			continue;
		}
		why = ps_client_shard_error(*cp, k, x->why, sizeof(x->why));
		if (why)
			continue;
		int rc = ps_client_stats(*cp, k, &x->st);
		if (rc) {
			snprintf(x->why, sizeof(x->why), "%s", ps_client_error(*cp));
			continue;
		}
		x->up = 1;
	}
}

static uint64_t sum8(const uint64_t *v)
{
	uint64_t s = 0;

	for (int i = 0; i < 8; i++)
		s += v[i];
	return s;
}

/* Counter difference; a shard restarted in between counts from zero. */
static uint64_t delta(uint64_t b, uint64_t a)
{
	return b >= a ? b - a : b;
}

/* p50 and p99 of the interval's latency histograms. */
static void set_quantiles(struct row *r)
{
	r->push_p50 = ps_histo_quantile(r->push_lat, PS_HISTO_BUCKETS, 0.5);
	r->push_p99 = ps_histo_quantile(r->push_lat, PS_HISTO_BUCKETS, 0.99);
	r->pull_p50 = ps_histo_quantile(r->pull_lat, PS_HISTO_BUCKETS, 0.5);
	r->pull_p99 = ps_histo_quantile(r->pull_lat, PS_HISTO_BUCKETS, 0.99);
}

static void make_row(const struct snap *a, const struct snap *b, double dt, int nworkers,
		     struct row *r)
{
	const struct ps_shard_stats *x = &a->st, *y = &b->st;
	int restarted = !a->up || y->uptime_s < x->uptime_s;
	static const struct ps_shard_stats zero;

	memset(r, 0, sizeof(*r));
	r->up = b->up;
	r->push_p50 = r->push_p99 = r->pull_p50 = r->pull_p99 = NAN;
	if (!b->up)
		return;
	if (restarted)
		x = &zero;
	if (restarted && a->up == 0)
		dt = y->uptime_s > 0 && y->uptime_s < dt ? y->uptime_s : dt;
	r->uptime_s = y->uptime_s;
	r->push_s = (double)delta(y->pushes, x->pushes) / dt;
	r->pull_s = (double)delta(y->pulls, x->pulls) / dt;
	r->in_raw = (double)delta(sum8(y->push_raw_bytes), sum8(x->push_raw_bytes)) / dt / 1e6;
	r->in_wire = (double)delta(sum8(y->push_wire_bytes), sum8(x->push_wire_bytes)) / dt / 1e6;
	r->out_raw = (double)delta(y->pull_raw_bytes, x->pull_raw_bytes) / dt / 1e6;
	r->out_wire = (double)delta(y->pull_wire_bytes, x->pull_wire_bytes) / dt / 1e6;
	for (int i = 0; i < PS_HISTO_BUCKETS; i++) {
		r->push_lat[i] = delta(y->push_lat[i], x->push_lat[i]);
		r->pull_lat[i] = delta(y->pull_lat[i], x->pull_lat[i]);
	}
	set_quantiles(r);
	r->apply_share = (y->apply_seconds - x->apply_seconds) / dt;
	if (r->apply_share < 0)
		r->apply_share = 0;
	r->rejected = y->rejected_frames;
	r->auth_failures = y->auth_failures;
	r->dups = y->duplicate_pushes;
	r->errors = y->errors;
	r->conns = y->connections;
	r->ckpt_on = y->checkpoint_on;
	r->ckpt_age = y->checkpoint_age_s;
	r->ckpt_failures = y->checkpoint_failures;
	r->ckpt_stale = y->checkpoint_on && y->checkpoint_every_s &&
			y->checkpoint_age_s > 2.0 * y->checkpoint_every_s;
	r->nworkers = (unsigned)nworkers;
	for (int w = 0; w < y->nworkers && w < 64; w++) {
		uint64_t c = y->worker_clock[w];
		r->workers_up += y->worker_up[w];
		if (!r->have_clock || c < r->clk_min)
			r->clk_min = c;
		if (!r->have_clock || c > r->clk_max)
			r->clk_max = c;
		r->have_clock = 1;
	}
}

/* Adds shard row r into the totals t (set_quantiles once all are in). */
static void add_row(struct row *t, const struct row *r)
{
	if (!r->up)
		return;
	if (!t->up || r->uptime_s > t->uptime_s)
		t->uptime_s = r->uptime_s;
	t->push_s += r->push_s;
	t->pull_s += r->pull_s;
	t->in_raw += r->in_raw;
	t->in_wire += r->in_wire;
	t->out_raw += r->out_raw;
	t->out_wire += r->out_wire;
	for (int i = 0; i < PS_HISTO_BUCKETS; i++) {
		t->push_lat[i] += r->push_lat[i];
		t->pull_lat[i] += r->pull_lat[i];
	}
	if (r->have_clock) {
		if (!t->have_clock || r->clk_min < t->clk_min)
			t->clk_min = r->clk_min;
		if (!t->have_clock || r->clk_max > t->clk_max)
			t->clk_max = r->clk_max;
		t->have_clock = 1;
	}
	t->apply_share += r->apply_share;
	t->rejected += r->rejected;
	t->auth_failures += r->auth_failures;
	t->dups += r->dups;
	t->errors += r->errors;
	if (r->ckpt_on) {
		t->ckpt_age = !t->ckpt_on || r->ckpt_age > t->ckpt_age ? r->ckpt_age : t->ckpt_age;
		t->ckpt_on = 1;
		t->ckpt_failures += r->ckpt_failures;
		t->ckpt_stale |= r->ckpt_stale;
	}
	t->conns += r->conns;
	if (r->workers_up > t->workers_up)
		t->workers_up = r->workers_up;
	t->nworkers = r->nworkers;
	t->up = 1;
}

static const char *fmt_dur(double s, char *buf, size_t n)
{
	if (isnan(s))
		snprintf(buf, n, "-");
	else if (s < 1e-3)
		snprintf(buf, n, "%.0fus", s * 1e6);
	else if (s < 1.0)
		snprintf(buf, n, "%.1fms", s * 1e3);
	else
		snprintf(buf, n, "%.2fs", s);
	return buf;
}

/* The shards' checkpoints (checkpoint.dir set): age of the last good one,
 * failures, and a flag on a shard whose checkpoint is older than twice
 * checkpoint.every_s (they stopped: a full disk? training goes on, and
 * what came after is lost when the shard stops or dies). */
static void print_checkpoints(FILE *f, const struct ps_config *cfg, const struct snap *b,
			      const struct row *rows)
{
	char age[32];

	if (!cfg->checkpoint.dir[0])
		return;
	fprintf(f, "\n%-6s %-16s %8s\n", "shard", "checkpoint age", "failed");
	for (int k = 0; k < cfg->nshards; k++) {
		const struct row *r = &rows[k];

		if (!b[k].up || !r->ckpt_on) {
			fprintf(f, "%-6d %-16s %8s\n", k, b[k].up ? "off" : "-", "-");
			continue;
		}
		snprintf(age, sizeof(age), "%.1f s", r->ckpt_age);
		fprintf(f, "%-6d %-16s %8" PRIu64 "%s\n", k, age,
			r->ckpt_failures, r->ckpt_stale ? "  STALE: older than twice "
			"checkpoint.every_s (the shard's log says why they fail)"
			: r->ckpt_failures ? "  (some failed: the shard's log says why)" : "");
	}
}

static const char *fmt_uptime(double s, char *buf, size_t n)
{
	uint64_t t = (uint64_t)s;

	if (t < 3600)
		snprintf(buf, n, "%um%02us", (unsigned)(t / 60), (unsigned)(t % 60));
	else if (t < 86400)
		snprintf(buf, n, "%uh%02um", (unsigned)(t / 3600), (unsigned)(t / 60 % 60));
	else
		snprintf(buf, n, "%ud%02uh", (unsigned)(t / 86400), (unsigned)(t / 3600 % 24));
	return buf;
}

/* The most the finished clocks of two workers can differ by: a worker
 * that has finished clock c pulls for c + 1 once the slowest has finished
 * c + 1 - staleness (sync: all of c + 1), then finishes c + 1 itself: so
 * staleness + 1 (sync: 1). The gap column shows the gap against it. */
static uint64_t gap_limit(const struct ps_config *cfg)
{
	return cfg->consistency == PS_SYNC ? 1 : (uint64_t)cfg->staleness + 1;
}

static void print_row(FILE *f, const char *name, const struct row *r, uint64_t limit)
{
	char up[32], a[16], b[16], c[16], d[16], clk[64];

	if (!r->have_clock)
		snprintf(clk, sizeof(clk), "-");
	else
		snprintf(clk, sizeof(clk), "%" PRIu64 "..%" PRIu64 " (%" PRIu64 "/%" PRIu64 ")",
			 r->clk_min, r->clk_max, r->clk_max - r->clk_min, limit);
	fprintf(f, "%-6s %-4s %8s %8.0f %8.0f %7.1f/%-7.1f %7.1f/%-7.1f %7s/%-7s %7s/%-7s "
		   "%-24s %5.1f%% %6" PRIu64 " %5u %3u/%-3u\n",
		name, "up", fmt_uptime(r->uptime_s, up, sizeof(up)), r->push_s, r->pull_s,
		r->in_raw, r->in_wire, r->out_raw, r->out_wire,
		fmt_dur(r->push_p50, a, sizeof(a)), fmt_dur(r->push_p99, b, sizeof(b)),
		fmt_dur(r->pull_p50, c, sizeof(c)), fmt_dur(r->pull_p99, d, sizeof(d)), clk,
		100.0 * r->apply_share, r->rejected, r->conns, r->workers_up, r->nworkers);
}

/* Embedding tables: one line per table and shard (counters since start). */
static void print_tables(FILE *f, const struct ps_config *cfg, const struct snap *b)
{
	int any = 0;

	for (int k = 0; k < cfg->nshards; k++) {
		for (int t = 0; b[k].up && t < b[k].st.ntables; t++) {
			const struct ps_table_stats *ts = &b[k].st.tables[t];
			if (!any++)
				fprintf(f, "\n%-16s %-5s %12s %9s %12s %10s %10s %10s %7s %12s %12s\n",
					"table", "shard", "rows", "bytes/row", "admitted", "evicted",
					"expired", "filter ids", "hit %", "pulled", "pushed");
			fprintf(f, "%-16s %-5d %12" PRIu64 " %9.1f %12" PRIu64 " %10" PRIu64 " %10"
				PRIu64 " %10" PRIu64 " %7.1f %12" PRIu64 " %12" PRIu64 "\n", ts->name, k,
				ts->rows, ts->rows ? (double)ts->bytes / (double)ts->rows : 0.0,
				ts->admitted, ts->evicted, ts->expired, ts->filter_ids,
				ts->filter_lookups ? 100.0 * (double)ts->filter_hits /
							     (double)ts->filter_lookups : 0.0,
				ts->pulled_rows, ts->pushed_rows);
		}
	}
}

/* The member list of st ("0 1 3", the first 64) into buf. */
static void member_list(const struct ps_shard_stats *st, char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = '\0';
	for (int i = 0; i < st->nmembers && i < 64 && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? " " : "", st->members[i]);
	if (st->nmembers > 64 && at < len)
		snprintf(buf + at, len - at, " ...");
}

/* ,"membership":{...} of one process's stats (--json). */
static void json_membership(FILE *f, const struct ps_shard_stats *x)
{
	fprintf(f, ",\"membership\":{\"epoch\":%" PRIu64 ",\"clock\":%" PRIu64 ",\"joins\":%"
		PRIu64 ",\"leaves\":%" PRIu64 ",\"count\":%d,\"members\":[", x->member_epoch,
		x->member_current, x->joins, x->leaves, x->nmembers);
	for (int i = 0; i < x->nmembers && i < 64; i++)
		fprintf(f, "%s%d", i ? "," : "", x->members[i]);
	fprintf(f, "]}");
}

/* Elastic membership (docs/reliability.md): per shard, the epoch at its
 * clock, the members of that clock, the joins and leaves so far. Shown when
 * the cluster is elastic or a worker joined or left. */
static void print_members(FILE *f, const struct ps_config *cfg, const struct snap *b)
{
	int any = cfg->initial_workers && cfg->initial_workers < cfg->nworkers;

	for (int k = 0; k < cfg->nshards; k++)
		any |= b[k].up && (b[k].st.joins || b[k].st.leaves);
	if (!any)
		return;
	fprintf(f, "\n%-6s %6s %8s %6s %6s %s\n", "shard", "epoch", "at clock", "joins", "leaves",
		"members");
	for (int k = 0; k < cfg->nshards; k++) {
		char list[400];

		if (!b[k].up) {
			fprintf(f, "%-6d down\n", k);
			continue;
		}
		member_list(&b[k].st, list, sizeof(list));
		fprintf(f, "%-6d %6" PRIu64 " %8" PRIu64 " %6" PRIu64 " %6" PRIu64 " %d: %s\n", k,
			b[k].st.member_epoch, b[k].st.member_current, b[k].st.joins, b[k].st.leaves,
			b[k].st.nmembers, list);
	}
}

/* What a shard has under way, into buf: a re-shard's stop, joins,
 * leaves; "-" when nothing. */
static void changes(const struct ps_shard_stats *x, char *buf, size_t len)
{
	size_t at = 0;

#define ADD(...) (at += (size_t)snprintf(buf + at, at < len ? len - at : 0, __VA_ARGS__))
	buf[0] = '\0';
	if (x->stop_at)
		ADD("re-shard stop pending at clock %" PRIu64 " (%s)", x->stop_at,
		    x->stop_committed ? "committed" : "prepared");
	for (int i = 0; i < x->njoining && i < 16; i++)
		ADD("%sworker %d joining at clock %" PRIu64, at ? "; " : "", x->joining[i],
		    x->joining_clock[i]);
	for (int i = 0; i < x->nleaving && i < 16; i++)
		ADD("%sworker %d leaving (trains up to clock %" PRIu64 ")", at ? "; " : "",
		    x->leaving[i], x->leaving_clock[i]);
	if (!at)
		ADD("-");
#undef ADD
}

/* Re-sharding (docs/elastic.md, "Operations"): per shard, its map epoch
 * (re-shards its state went through), what its --reshard-from start took
 * in, and the changes under way. Shown once the cluster was re-sharded or
 * a change is under way. */
static void print_reshard(FILE *f, const struct ps_config *cfg, const struct snap *b)
{
	int any = 0;

	for (int k = 0; k < cfg->nshards; k++)
		any |= b[k].up && (b[k].st.map_epoch || b[k].st.stop_at || b[k].st.njoining ||
				   b[k].st.nleaving);
	if (!any)
		return;
	fprintf(f, "\n%-6s %9s %-28s %s\n", "shard", "map epoch", "moved in at its start",
		"change in progress");
	for (int k = 0; k < cfg->nshards; k++) {
		const struct ps_shard_stats *x = &b[k].st;
		char in[64], what[600];

		if (!b[k].up) {
			fprintf(f, "%-6d down\n", k);
			continue;
		}
		if (x->reshard_in_slices || x->reshard_in_rows)
			snprintf(in, sizeof(in), "%" PRIu64 " slices, %" PRIu64 " rows, %.1f %s",
				 x->reshard_in_slices, x->reshard_in_rows,
				 (double)x->reshard_in_bytes / (x->reshard_in_bytes < 1048576 ?
								 1024.0 : 1048576.0),
				 x->reshard_in_bytes < 1048576 ? "KiB" : "MiB");
		else
			snprintf(in, sizeof(in), "-");
		changes(x, what, sizeof(what));
		fprintf(f, "%-6d %9" PRIu64 " %-28s %s\n", k, x->map_epoch, in, what);
	}
}

/* ,"map_epoch":...,"reshard_in":{...},"reshard_stop":...,"joining":[...],
 * "leaving":[...] of one shard (--json). */
static void json_reshard(FILE *f, const struct ps_shard_stats *x)
{
	fprintf(f, ",\"map_epoch\":%" PRIu64 ",\"reshard_in\":{\"bytes\":%" PRIu64 ",\"slices\":%"
		PRIu64 ",\"rows\":%" PRIu64 "},\"reshard_stop\":", x->map_epoch,
		x->reshard_in_bytes, x->reshard_in_slices, x->reshard_in_rows);
	if (x->stop_at)
		fprintf(f, "{\"clock\":%" PRIu64 ",\"committed\":%s}", x->stop_at,
			x->stop_committed ? "true" : "false");
	else
		fprintf(f, "null");
	for (int w = 0; w < 2; w++) {
		int n = w ? x->nleaving : x->njoining;

		fprintf(f, ",\"%s\":[", w ? "leaving" : "joining");
		for (int i = 0; i < n && i < 16; i++)
			fprintf(f, "%s{\"rank\":%d,\"clock\":%" PRIu64 "}", i ? "," : "",
				w ? x->leaving[i] : x->joining[i],
				w ? x->leaving_clock[i] : x->joining_clock[i]);
		fputc(']', f);
	}
}

static void print_table(FILE *f, const struct ps_config *cfg, const struct snap *b,
			const struct row *rows, const struct row *tot, double dt, int workers)
{
	fprintf(f, "ps-stat: %d shard(s), %d worker(s), %s, rates over %.1f s\n", cfg->nshards,
		cfg->nworkers, cfg->consistency == PS_SYNC ? "sync" : "async", dt);
	fprintf(f, "%-6s %-4s %8s %8s %8s %15s %15s %15s %15s %-24s %6s %6s %5s %7s\n", "shard",
		"st", "uptime", "push/s", "pull/s", "in MB/s raw/wire", "out MB/s raw/wire",
		"push p50/p99", "pull p50/p99", "clock min..max (gap/max)", "apply", "reject", "conns",
		"workers");
	for (int k = 0; k < cfg->nshards; k++) {
		char name[16];

		snprintf(name, sizeof(name), "%d", k);
		if (rows[k].up)
			print_row(f, name, &rows[k], gap_limit(cfg));
		else
			fprintf(f, "%-6s %-4s %s\n", name, "down", b[k].why);
	}
	if (tot->up)
		print_row(f, "total", tot, gap_limit(cfg));
	else
		fprintf(f, "%-6s %-4s no shard answered\n", "total", "down");
	print_tables(f, cfg, b);
	print_checkpoints(f, cfg, b, rows);
	print_members(f, cfg, b);
	print_reshard(f, cfg, b);
	if (cfg->replicas) {
		static const char *const role[] = { "off", "joining", "backup", "primary" };
		fprintf(f, "\n%-6s %-22s %-8s %6s %-22s %-8s %9s %9s\n", "shard", "process", "role",
			"epoch", "partner", "partner", "lag", "failovers");
		for (int k = 0; k < cfg->nshards; k++)
			for (int r = 0; r < 2; r++) {
				const struct ps_endpoint *ep = ps_config_replica_addr(cfg, k, r);
				const struct ps_shard_stats *x = &b[k].rep[r];
				char addr[300];

				snprintf(addr, sizeof(addr), "%s:%d", ep->host, ep->port);
				if (!b[k].rep_up[r]) {
					fprintf(f, "%-6d %-22s %-8s\n", k, addr, "down");
					continue;
				}
				fprintf(f, "%-6d %-22s %-8s %6" PRIu64 " %-22s %-8s %9" PRIu64 " %9" PRIu64
					"\n", k, addr, role[x->repl_state & 3], x->repl_epoch,
					x->repl_partner, x->repl_partner_up ? "up"
					: x->repl_state == 3 ? "ALONE" : "down", x->repl_lag,
					x->repl_failovers);
			}
	}
	if (!workers)
		return;
	fprintf(f, "\n%-6s %-9s %-24s %s\n", "worker", "connected", "clock (per shard)",
		"behind the fastest");
	for (int w = 0; w < cfg->nworkers && w < 64; w++) {
		char clocks[256] = "";
		size_t len = 0;
		uint64_t lo = UINT64_MAX;
		int conn = 0, any = 0;

		for (int k = 0; k < cfg->nshards; k++) {
			if (!b[k].up || w >= b[k].st.nworkers) {
				len += (size_t)snprintf(clocks + len, len < sizeof(clocks) ?
							sizeof(clocks) - len : 0, "%s-", k ? " " : "");
				continue;
			}
			uint64_t c = b[k].st.worker_clock[w];
			conn |= b[k].st.worker_up[w];
			lo = c < lo ? c : lo;
			any = 1;
			len += (size_t)snprintf(clocks + len, len < sizeof(clocks) ?
						sizeof(clocks) - len : 0, "%s%" PRIu64, k ? " " : "",
						c);
		}
		if (any && tot->have_clock)
			fprintf(f, "%-6d %-9s %-24s %" PRIu64 "\n", w, conn ? "yes" : "no", clocks,
				tot->clk_max - lo);
		else
			fprintf(f, "%-6d %-9s %-24s -\n", w, "?", clocks);
	}
	if (cfg->nworkers > 64)
		fprintf(f, "(workers 64..%d not shown: shards report the first 64)\n",
			cfg->nworkers - 1);
}

/* Writes "key":v, (null when not finite), with the comma that follows. */
static void json_num(FILE *f, const char *key, double v)
{
	if (isnan(v) || isinf(v))
		fprintf(f, "\"%s\":null,", key);
	else
		fprintf(f, "\"%s\":%.6g,", key, v);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", (unsigned char)*s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static void json_row(FILE *f, const struct row *r, uint64_t limit)
{
	const struct { const char *key; double v; } nums[] = {
		{ "uptime_s", r->uptime_s }, { "pushes_per_s", r->push_s },
		{ "pulls_per_s", r->pull_s }, { "in_raw_mb_per_s", r->in_raw },
		{ "in_wire_mb_per_s", r->in_wire }, { "out_raw_mb_per_s", r->out_raw },
		{ "out_wire_mb_per_s", r->out_wire }, { "push_p50_s", r->push_p50 },
		{ "push_p99_s", r->push_p99 }, { "pull_p50_s", r->pull_p50 },
		{ "pull_p99_s", r->pull_p99 },
	};

	fprintf(f, "\"up\":%s,", r->up ? "true" : "false");
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		json_num(f, nums[i].key, nums[i].v);
	if (r->have_clock)
		fprintf(f, "\"clock_min\":%" PRIu64 ",\"clock_max\":%" PRIu64
			   ",\"staleness\":%" PRIu64 ",\"clock_gap_max\":%" PRIu64 ",", r->clk_min,
			r->clk_max, r->clk_max - r->clk_min, limit);
	else
		fprintf(f, "\"clock_min\":null,\"clock_max\":null,\"staleness\":null,"
			   "\"clock_gap_max\":%" PRIu64 ",", limit);
	json_num(f, "apply_share", r->apply_share);
	fprintf(f, "\"rejected_frames\":%" PRIu64 ",\"auth_failures\":%" PRIu64
		   ",\"duplicate_pushes\":%" PRIu64 ",\"errors\":%" PRIu64
		   ",\"connections\":%u,\"workers_connected\":%u",
		r->rejected, r->auth_failures, r->dups, r->errors, r->conns,
		r->workers_up);
	if (r->ckpt_on)
		fprintf(f, ",\"checkpoint_age_s\":%.3f,\"checkpoint_failures\":%" PRIu64
			   ",\"checkpoint_stale\":%s", r->ckpt_age, r->ckpt_failures,
			r->ckpt_stale ? "true" : "false");
}

static void print_json(FILE *f, const struct ps_config *cfg, const struct snap *b,
		       const struct row *rows, const struct row *tot, double dt, int workers)
{
	fprintf(f, "{\"time\":%.3f,\"interval_s\":%.3f,\"shards\":[", (double)time(NULL), dt);
	for (int k = 0; k < cfg->nshards; k++) {
		fprintf(f, "%s{\"shard\":%d,\"address\":\"%s:%d\",", k ? "," : "", k,
			cfg->shards[k].host, cfg->shards[k].port);
		json_row(f, &rows[k], gap_limit(cfg));
		if (!rows[k].up) {
			fprintf(f, ",\"reason\":");
			json_str(f, b[k].why);
		}
		fprintf(f, ",\"tables\":[");
		for (int t = 0; rows[k].up && t < b[k].st.ntables; t++) {
			const struct ps_table_stats *ts = &b[k].st.tables[t];
			fprintf(f, "%s{\"name\":", t ? "," : "");
			json_str(f, ts->name);
			fprintf(f, ",\"dim\":%u,\"rows\":%" PRIu64 ",\"bytes\":%" PRIu64
				",\"admitted\":%" PRIu64 ",\"evicted\":%" PRIu64 ",\"cap_rows\":%"
				PRIu64 ",\"expired\":%" PRIu64
				",\"filter_ids\":%" PRIu64 ",\"filter_bytes\":%" PRIu64
				",\"filter_lookups\":%" PRIu64 ",\"filter_hits\":%" PRIu64
				",\"pulled_rows\":%" PRIu64 ",\"pushed_rows\":%" PRIu64
				",\"version\":%" PRIu64 ",\"checksum\":\"%016" PRIx64 "\","
				"\"epoch_unix\":%.6f}", ts->dim,
				ts->rows, ts->bytes, ts->admitted, ts->evicted, ts->cap_rows,
				ts->expired, ts->filter_ids, ts->filter_bytes, ts->filter_lookups,
				ts->filter_hits, ts->pulled_rows, ts->pushed_rows, ts->version,
				ts->checksum, ts->epoch_unix);
		}
		fputc(']', f);
		if (rows[k].up) {
			json_membership(f, &b[k].st);
			json_reshard(f, &b[k].st);
		}
		if (cfg->replicas) {
			static const char *const role[] = { "off", "joining", "backup", "primary" };
			fprintf(f, ",\"replicas\":[");
			for (int r = 0; r < 2; r++) {
				const struct ps_endpoint *ep = ps_config_replica_addr(cfg, k, r);
				const struct ps_shard_stats *x = &b[k].rep[r];
				fprintf(f, "%s{\"address\":\"%s:%d\",\"up\":%s", r ? "," : "",
					ep->host, ep->port, b[k].rep_up[r] ? "true" : "false");
				if (b[k].rep_up[r])
					fprintf(f, ",\"role\":\"%s\",\"epoch\":%" PRIu64 ",\"partner\":"
						"\"%s\",\"partner_up\":%s,\"lag\":%" PRIu64 ",\"failovers\":%"
						PRIu64 ",\"batch\":%" PRIu64 ",\"repl_batches\":%" PRIu64
						",\"repl_bytes\":%" PRIu64 ",\"repl_heartbeats\":%" PRIu64,
						role[x->repl_state & 3], x->repl_epoch, x->repl_partner,
						x->repl_partner_up ? "true" : "false", x->repl_lag,
						x->repl_failovers, x->repl_lsn, x->repl_batches, x->repl_bytes,
						x->repl_heartbeats);
				if (b[k].rep_up[r]) /* the backup's is the primary's, replicated */
					json_membership(f, x);
				fputc('}', f);
			}
			fputc(']', f);
		}
		fputc('}', f);
	}
	fprintf(f, "],\"totals\":{");
	json_row(f, tot, gap_limit(cfg));
	fputc('}', f);
	if (workers) {
		fprintf(f, ",\"workers\":[");
		for (int w = 0; w < cfg->nworkers && w < 64; w++) {
			int conn = 0;

			fprintf(f, "%s{\"rank\":%d,\"clocks\":[", w ? "," : "", w);
			for (int k = 0; k < cfg->nshards; k++) {
				if (b[k].up && w < b[k].st.nworkers) {
					fprintf(f, "%s%" PRIu64, k ? "," : "", b[k].st.worker_clock[w]);
					conn |= b[k].st.worker_up[w];
				} else {
					fprintf(f, "%snull", k ? "," : "");
				}
			}
			fprintf(f, "],\"connected\":%s}", conn ? "true" : "false");
		}
		fputc(']', f);
	}
	fprintf(f, "}\n");
}

/* --checkpoint: every shard writes its checkpoint; one line per shard.
 * 0 when all did, else 1. */
static int checkpoint_all(const struct ps_config *cfg, struct ps_client **cp)
{
	struct ps_shard_stats *st = malloc(sizeof(*st));
	char err[512];
	int bad = 0;

	if (!st)
		return 1;
	if (ps_client_init(cp, cfg, -1, err, sizeof(err))) {
		fprintf(stderr, "ps-stat: %s\n", err);
		free(st);
		return 1;
	}
	for (int k = 0; k < cfg->nshards; k++) {
		const char *why = ps_client_shard_error(*cp, k, err, sizeof(err));

		if (!why && ps_client_checkpoint(*cp, k, 1, st))
			why = ps_client_error(*cp);
		if (!why && st->checkpoint_status)
			why = st->checkpoint_error;
		if (why) {
			printf("shard %d: checkpoint failed: %s\n", k, why);
			bad = 1;
			continue;
		}
		printf("shard %d: checkpoint written: %s (%.1f MiB in %.3f s, worker 0 at clock %" PRIu64 ")\n",
		       k, st->checkpoint_path, (double)st->checkpoint_bytes / 1048576.0,
		       st->checkpoint_seconds, st->nworkers > 0 ? st->worker_clock[0] : 0);
	}
	free(st);
	return bad;
}

/* Sleeps s seconds unless a signal stops us first. */
static void nap(double s)
{
	double until = ps_now_s() + s;

	while (!stop && ps_now_s() < until) {
		double left = until - ps_now_s();
		struct timespec ts = { .tv_sec = (time_t)left,
				       .tv_nsec = (long)((left - (double)(time_t)left) * 1e9) };
		nanosleep(&ts, NULL);
	}
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "config", required_argument, NULL, 'c' }, { "watch", required_argument, NULL, 'w' },
		{ "interval", required_argument, NULL, 'i' }, { "json", no_argument, NULL, 'j' },
		{ "workers", no_argument, NULL, 'W' }, { "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "checkpoint", no_argument, NULL, 'C' },
		{ "reshard-stop", no_argument, NULL, 'R' },
		{ "reshard-cancel", no_argument, NULL, 'X' },
		{ "secret-file", required_argument, NULL, 'K' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .interval = 1.0 };
	struct ps_config *cfg = malloc(sizeof(*cfg));
	struct snap *a = NULL, *b = NULL;
	struct row *rows = NULL, tot;
	struct ps_client *c = NULL;
	char err[1024];
	int opt, rc = 2, tty = isatty(STDOUT_FILENO);
	double ta, tb;

	if (!cfg)
		return 2;
	while ((opt = getopt_long(argc, argv, "c:w:i:jWCh", lopts, NULL)) != -1) {
		switch (opt) {
		case 'c': o.config = optarg; break;
		case 'w':
			if (parse_seconds("--watch", optarg, 0.1, &o.watch))
				goto out;
			break;
		case 'i':
			if (parse_seconds("--interval", optarg, 0.05, &o.interval))
				goto out;
			break;
		case 'j': o.json = 1; break;
		case 'W': o.workers = 1; break;
		case 'C': o.checkpoint = 1; break;
		case 'R': o.reshard_stop = 1; break;
		case 'X': o.reshard_stop = 2; break;
		case 'K': o.secret = optarg; break;
		case 'V': ps__version_print(stdout, "ps-stat"); rc = 0; goto out;
		case 'h': usage(stdout); rc = 0; goto out;
		default: fprintf(stderr, "Try 'ps-stat --help'.\n"); goto out;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ps-stat: unexpected argument '%s'\nTry 'ps-stat --help'.\n",
			argv[optind]);
		goto out;
	}
	if (!o.config) {
		fprintf(stderr, "ps-stat: --config FILE is required\nTry 'ps-stat --help'.\n");
		goto out;
	}
	if (ps_config_load(cfg, o.config, err, sizeof(err))) {
		fprintf(stderr, "ps-stat: %s\n", err);
		goto out;
	}
	if (o.secret && ps_auth_set_secret_file(cfg, o.secret)) {
		fprintf(stderr, "ps-stat: --secret-file: name too long\n");
		goto out;
	}
	ps_log_init("stat", -1);
	ps_log_set_level(PS_LOG_OFF);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	a = calloc((size_t)cfg->nshards, sizeof(*a));
	b = calloc((size_t)cfg->nshards, sizeof(*b));
	rows = calloc((size_t)cfg->nshards, sizeof(*rows));
	if (!a || !b || !rows) {
		fprintf(stderr, "ps-stat: out of memory\n");
		goto out;
	}
	if (o.checkpoint) {
		rc = checkpoint_all(cfg, &c);
		goto out;
	}
	if (o.reshard_stop) {
		rc = ps__stat_reshard(cfg, &c, o.reshard_stop == 2, &stop);
		goto out;
	}
	sample(cfg, &c, a);
	ta = ps_now_s();
	for (int round = 0; !stop; round++) {
		nap(o.watch > 0 ? o.watch : o.interval);
		if (stop && round > 0)
			break;
		sample(cfg, &c, b);
		tb = ps_now_s();
		memset(&tot, 0, sizeof(tot));
		rc = 0;
		for (int k = 0; k < cfg->nshards; k++) {
			make_row(&a[k], &b[k], tb - ta, cfg->nworkers, &rows[k]);
			add_row(&tot, &rows[k]);
			rc |= !rows[k].up;
		}
		set_quantiles(&tot);
		if (o.json) {
			print_json(stdout, cfg, b, rows, &tot, tb - ta, o.workers);
		} else {
			if (o.watch > 0 && tty)
				fputs("\033[H\033[2J", stdout); /* redraw in place */
			else if (round > 0)
				fputc('\n', stdout);
			print_table(stdout, cfg, b, rows, &tot, tb - ta, o.workers);
		}
		fflush(stdout);
		if (o.watch <= 0)
			break;
		memcpy(a, b, (size_t)cfg->nshards * sizeof(*a));
		ta = tb;
	}
out:
	ps_client_free(c);
	ps_client_free(bclient);
	free(bcfg);
	free(rows);
	free(a);
	free(b);
	free(cfg);
	return rc;
}
