/* it_stat.c - ps-stat against real shards: while two workers push and pull,
 * its JSON and table show both shards up with nonzero rates, latencies and
 * the workers' clocks; with one shard killed it still prints the other,
 * shows the dead one as down with the reason and exits 1; bad flags and
 * bad configs exit 2 with a message naming the fault. The shards' Prometheus
 * endpoints (stats.http) serve counters that match the traffic, histograms,
 * /healthz, 404 and 405, pass `promtool check metrics` when it is
 * installed, and a port already taken stops the shard with a clear error;
 * one address holding slow connections cannot take the endpoint from
 * others, and /healthz does not cost the shard's loop. */
#include <check.h>
#include <math.h>
#include <inttypes.h>
#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <sys/stat.h>
#include "config.h"
#include "histo.h"
#include "ps_time.h"
#include "ps_client.h"
#include "ps_err.h"
#include "test_util.h"

struct traffic {
	const struct ps_config *cfg;
	volatile int stop;
	int clocks, rc;
	char err[512];
};

/* Two worker ranks in one thread: each clock, both push then both pull
 * (sync: the pulls are answered once both pushes are in). */
static void *traffic_main(void *p)
{
	struct traffic *tr = p;
	struct ps_client *c[2] = { NULL, NULL };
	struct ps_tensor t = { .name = "a" };
	float *g = calloc(3000, sizeof(float)), *w = calloc(3000, sizeof(float));

	t.count = 3000;
	for (int r = 0; r < 2; r++) {
		int rc = 0;

		for (int i = 0; i < 100; i++) {
			rc = ps_client_init(&c[r], tr->cfg, r, tr->err, sizeof(tr->err));
			if (rc != -ECONNREFUSED)
				break;
			tu_sleep_ms(100); /* the shards are still starting */
		}
		if ((tr->rc = rc))
			goto out;
	}
	for (uint64_t clock = 0; !tr->stop; clock++) {
		int64_t id[4];

		t.data = g;
		for (int r = 0; r < 2; r++)
			id[r] = ps_client_push(c[r], clock, &t, 1, PS_PUSH_END_CLOCK);
		t.data = w;
		for (int r = 0; r < 2; r++)
			id[2 + r] = ps_client_pull(c[r], clock + 1, &t, 1);
		for (int k = 0; k < 4; k++) {
			tr->rc = id[k] < 0 ? (int)id[k] : ps_client_wait(c[k % 2], id[k]);
			if (tr->rc) {
				snprintf(tr->err, sizeof(tr->err), "%s", ps_client_error(c[k % 2]));
				goto out;
			}
		}
		tr->clocks++;
		tu_sleep_ms(2);
	}
out:
	ps_client_free(c[0]);
	ps_client_free(c[1]);
	free(g);
	free(w);
	return NULL;
}

/* Runs bin/ps-stat with args; its stdout (and stderr when err_too) into out. */
static int run_stat(const char *args, char *out, size_t n, int err_too)
{
	char cmd[1024];
	FILE *p;
	size_t len = 0;
	int st;

	snprintf(cmd, sizeof(cmd), "bin/ps-stat %s%s", args, err_too ? " 2>&1" : " 2>/dev/null");
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	while (len + 1 < n && !feof(p))
		len += fread(out + len, 1, n - 1 - len, p);
	out[len] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The number after "key": in s (the first occurrence), or NAN (null or absent). */
static double jnum(const char *s, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = s ? strstr(s, pat) : NULL;
	if (!p || !strncmp(p + strlen(pat), "null", 4))
		return NAN;
	return strtod(p + strlen(pat), NULL);
}

static int count_of(const char *s, const char *needle)
{
	int n = 0;

	for (const char *p = s; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

/* Writes the 2-shard, 2-worker config of these tests (extra: more lines)
 * to a temporary file (path), loads it into cfg and starts both shards. */
static void start_shards(char *path, struct ps_config *cfg, int p0, int p1, const char *extra,
			 pid_t srv[2])
{
	char yaml[1024], err[512];

	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "slice_bytes: 4096\n"
		 "model:\n  tensors:\n    - {name: a, shape: [3000]}\n"
		 "%slog:\n  level: warn\n", p0, p1, extra);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
}

/* Starts the traffic thread and waits (10 s at most) for its first clocks. */
static void start_traffic(struct traffic *tr, pthread_t *th, int clocks)
{
	ck_assert_int_eq(pthread_create(th, NULL, traffic_main, tr), 0);
	for (int i = 0; i < 200 && tr->clocks < clocks && !tr->rc; i++)
		tu_sleep_ms(50);
	ck_assert_msg(tr->clocks >= clocks, "traffic did not start: %s (%d)", tr->err, tr->rc);
}

START_TEST(test_stat_live_and_down)
{
	static char out[65536];
	char path[64], args[256], err[512];
	struct ps_config cfg;
	struct traffic tr = { .cfg = &cfg };
	pthread_t th;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), rc;

	start_shards(path, &cfg, p0, p1, "", srv);
	start_traffic(&tr, &th, 5);

	/* JSON while traffic runs */
	snprintf(args, sizeof(args), "--config %s --json --workers --interval 0.5", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(rc == 0, "ps-stat exited %d: %s", rc, out);
	ck_assert_int_eq(count_of(out, "\n"), 1);                 /* one object */
	ck_assert_int_eq(count_of(out, "\"up\":true"), 3);        /* 2 shards + totals */
	const char *sh1 = strstr(out, "\"shard\":1"), *tot = strstr(out, "\"totals\"");
	ck_assert_ptr_nonnull(sh1);
	ck_assert_ptr_nonnull(tot);
	ck_assert_msg(jnum(out, "pushes_per_s") > 0, "%s", out);
	ck_assert_msg(jnum(sh1, "pulls_per_s") > 0, "%s", out);
	ck_assert_msg(jnum(tot, "in_raw_mb_per_s") > 0, "%s", out);
	ck_assert_msg(jnum(tot, "out_raw_mb_per_s") > 0, "%s", out);
	double p50 = jnum(tot, "push_p50_s"), p99 = jnum(tot, "push_p99_s");
	ck_assert_msg(p50 > 0 && p99 >= p50 && p99 < 10, "push p50 %g p99 %g", p50, p99);
	ck_assert_msg(jnum(tot, "pull_p50_s") > 0, "%s", out);
	/* sync, both ranks pushed the same clocks: the gap is at most 1 */
	ck_assert_msg(jnum(tot, "clock_max") >= 5, "%s", out);
	ck_assert_msg(jnum(tot, "staleness") <= 1, "%s", out);
	ck_assert_msg(jnum(tot, "workers_connected") == 2, "%s", out);
	ck_assert_msg(strstr(out, "\"workers\":[{\"rank\":0,\"clocks\":["), "%s", out);
	ck_assert_msg(strstr(out, "\"rank\":1,"), "%s", out);

	/* the table */
	snprintf(args, sizeof(args), "--config %s --interval 0.2", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(rc == 0, "ps-stat exited %d: %s", rc, out);
	ck_assert_msg(strstr(out, "push p50/p99") && strstr(out, "\n0      up") &&
		      strstr(out, "\n1      up") && strstr(out, "\ntotal  up"), "%s", out);

	/* --watch prints one table per refresh until stopped */
	snprintf(args, sizeof(args), "--config %s --watch 0.2 & sleep 1; kill -INT $!; wait",
		 path);
	run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(count_of(out, "\ntotal  up") >= 2, "%s", out);

	tr.stop = 1;
	pthread_join(th, NULL);
	ck_assert_msg(tr.rc == 0, "traffic: %s", tr.err);

	/* one shard gone: a running --watch shows it down at its next
	 * refreshes (a monitor does not wait for it to come back) */
	char watch_out[80], cmd[300];
	snprintf(watch_out, sizeof(watch_out), "%s.watch", path);
	snprintf(cmd, sizeof(cmd), "bin/ps-stat --config %s --watch 0.2 --json > %s 2>&1 & "
		 "echo $! > %s.pid", path, watch_out, watch_out);
	ck_assert_int_eq(system(cmd), 0);
	struct ps_client *mon = NULL; /* a monitor connected before the kill */
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	tu_sleep_ms(700);
	kill(srv[1], SIGKILL);
	tu_wait_child(srv[1]);
	/* ... reports the lost shard at once instead of reconnecting to it */
	struct ps_shard_stats sst;
	double t0 = ps_now_s();
	ck_assert_int_ne(ps_client_stats(mon, 1, &sst), 0);
	ck_assert_msg(ps_now_s() - t0 < 2, "the monitor waited %.1f s", ps_now_s() - t0);
	ck_assert_ptr_nonnull(ps_client_shard_error(mon, 1, err, sizeof(err)));
	ck_assert_int_eq(ps_client_stats(mon, 0, &sst), 0);
	ps_client_free(mon);
	tu_sleep_ms(1500);
	snprintf(cmd, sizeof(cmd), "kill -INT $(cat %s.pid); rm -f %s.pid", watch_out, watch_out);
	ck_assert_int_eq(system(cmd), 0);
	tu_sleep_ms(200);
	FILE *wf = fopen(watch_out, "r");
	ck_assert_ptr_nonnull(wf);
	static char line[65536], last[65536];
	int nlines = 0;
	while (fgets(line, sizeof(line), wf))
		if (strstr(line, "\"shard\":1")) {
			memcpy(last, line, sizeof(line));
			nlines++;
		}
	fclose(wf);
	unlink(watch_out);
	ck_assert_msg(nlines >= 5, "%d refreshes in 2.2 s", nlines);
	sh1 = strstr(last, "\"shard\":1");
	ck_assert_msg(sh1 && !strncmp(strstr(sh1, "\"up\":"), "\"up\":false", 10),
		      "the last refresh still shows shard 1 up: %s", last);

	/* one shard gone: the other still prints, exit status 1 */
	snprintf(args, sizeof(args), "--config %s --json --interval 0.1", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(rc == 1, "ps-stat exited %d: %s", rc, out);
	sh1 = strstr(out, "\"shard\":1");
	ck_assert_ptr_nonnull(sh1);
	ck_assert_msg(strstr(out, "\"shard\":0,\"address\":\"127.0.0.1:") &&
		      strstr(strstr(out, "\"shard\":0"), "\"up\":true"), "%s", out);
	ck_assert_msg(!strncmp(strstr(sh1, "\"up\":"), "\"up\":false", 10), "%s", out);
	snprintf(err, sizeof(err), "\"reason\":\"shard 1 (127.0.0.1:%d): connect", p1);
	ck_assert_msg(strstr(out, err), "no '%s' in %s", err, out);
	snprintf(args, sizeof(args), "--config %s --interval 0.1", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_int_eq(rc, 1);
	ck_assert_msg(strstr(out, "\n1      down shard 1 (127.0.0.1:") &&
		      strstr(out, "\n0      up"), "%s", out);

	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	unlink(path);
}
END_TEST

/* async, staleness 2: rank 0 runs as far ahead of a rank 1 that finished
 * nothing as the bound lets it (its pull for clock 3 is held), so the
 * finished clocks differ by 3 = staleness + 1: ps-stat shows that gap out
 * of the most the mode allows, "0..3 (3/3)", not a bare 3 that reads as
 * the bound of 2 broken (and "clock_gap_max":3 in its JSON). */
START_TEST(test_stat_gap_under_staleness)
{
	static char out[65536];
	char path[64], args[256], err[512];
	struct ps_config cfg;
	struct ps_client *c[2] = { NULL, NULL };
	float *g = calloc(3000, sizeof(float)), *w = calloc(3000, sizeof(float));
	struct ps_tensor tg = { .name = "a", .data = g, .count = 3000 };
	struct ps_tensor tw = { .name = "a", .data = w, .count = 3000 };
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), rc;

	start_shards(path, &cfg, p0, p1, "consistency: {mode: async, staleness: 2}\n", srv);
	for (int r = 0; r < 2; r++) {
		for (int i = 0; i < 100; i++) {
			rc = ps_client_init(&c[r], &cfg, r, err, sizeof(err));
			if (rc != -ECONNREFUSED)
				break;
			tu_sleep_ms(100); /* the shards are still starting */
		}
		ck_assert_msg(rc == 0, "rank %d: %s", r, err);
	}
	int64_t pull = 0;
	for (uint64_t clock = 0; clock < 3; clock++) {
		int64_t push = ps_client_push(c[0], clock, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_int_gt(push, 0);
		ck_assert_int_eq(ps_client_wait(c[0], push), 0);
		pull = ps_client_pull(c[0], 0, &tw, 1);
		ck_assert_int_gt(pull, 0);
		if (clock < 2)
			ck_assert_msg(ps_client_wait(c[0], pull) == 0, "%s", ps_client_error(c[0]));
	}
	/* the pull for clock 3 waits for rank 1 to finish clock 1 */
	ck_assert_int_eq(ps_client_wait_timeout(c[0], pull, 0.3), PS_ETIMEDOUT);

	snprintf(args, sizeof(args), "--config %s --interval 0.1", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(rc == 0, "ps-stat exited %d: %s", rc, out);
	ck_assert_msg(strstr(out, "clock min..max (gap/max)"), "%s", out);
	ck_assert_msg(strstr(out, "\ntotal  up") && strstr(strstr(out, "\ntotal  up"), " 0..3 (3/3) "),
		      "no '0..3 (3/3)' in the totals row: %s", out);
	snprintf(args, sizeof(args), "--config %s --json --interval 0.1", path);
	rc = run_stat(args, out, sizeof(out), 0);
	ck_assert_msg(rc == 0, "ps-stat exited %d: %s", rc, out);
	const char *tot = strstr(out, "\"totals\"");
	ck_assert_ptr_nonnull(tot);
	ck_assert_msg(jnum(tot, "staleness") == 3 && jnum(tot, "clock_gap_max") == 3, "%s", out);

	/* rank 1 catches up: the held pull is answered */
	for (uint64_t clock = 0; clock < 2; clock++) {
		int64_t push = ps_client_push(c[1], clock, &tg, 1, PS_PUSH_END_CLOCK);
		ck_assert_int_eq(ps_client_wait(c[1], push), 0);
	}
	ck_assert_msg(ps_client_wait_timeout(c[0], pull, 10) == 0, "%s", ps_client_error(c[0]));
	ps_client_free(c[0]);
	ps_client_free(c[1]);
	free(g);
	free(w);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}
END_TEST

START_TEST(test_stat_bad_usage)
{
	static char out[8192];
	char path[64];

	ck_assert_int_eq(run_stat("--help", out, sizeof(out), 1), 0);
	ck_assert_msg(strstr(out, "Usage: ps-stat --config FILE"), "%s", out);
	ck_assert_int_eq(run_stat("", out, sizeof(out), 1), 2);
	ck_assert_msg(strstr(out, "--config FILE is required"), "%s", out);
	ck_assert_int_eq(run_stat("--config x --watch nope", out, sizeof(out), 1), 2);
	ck_assert_msg(strstr(out, "--watch: expected seconds"), "%s", out);
	ck_assert_int_eq(run_stat("--bogus", out, sizeof(out), 1), 2);
	ck_assert_int_eq(run_stat("--config /nonexistent.yaml", out, sizeof(out), 1), 2);
	ck_assert_msg(strstr(out, "/nonexistent.yaml"), "%s", out);
	ck_assert_int_eq(tu_write_temp(path, "cluster:\n  servers: [127.0.0.1:1]\n"
					     "  workrs: 2\n"), 0);
	char args[128];
	snprintf(args, sizeof(args), "--config %s", path);
	ck_assert_int_eq(run_stat(args, out, sizeof(out), 1), 2);
	ck_assert_msg(strstr(out, ":3:") && strstr(out, "workers"), "%s", out);
	unlink(path);
}
END_TEST

/* method path to 127.0.0.1:port with a plain socket from address src (NULL:
 * any), with one more header line when hdr is not NULL; returns the HTTP
 * status and the body in body (NUL-terminated), or -1. */
static int http_req_from(const char *src, int port, const char *method, const char *path,
			 const char *hdr, char *body, size_t n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in from = { .sin_family = AF_INET };
	char req[512];
	size_t len = 0;
	ssize_t r;
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1;

	if (fd >= 0 && src && (inet_pton(AF_INET, src, &from.sin_addr) != 1 ||
			       bind(fd, (struct sockaddr *)&from, sizeof(from)))) {
		close(fd);
		return -1;
	}
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: x\r\n%s%s\r\n", method, path,
		 hdr ? hdr : "", hdr ? "\r\n" : "");
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -1;
	}
	while (len + 1 < n && (r = read(fd, body + len, n - 1 - len)) > 0)
		len += (size_t)r;
	body[len] = 0;
	close(fd);
	if (sscanf(body, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	char *b = strstr(body, "\r\n\r\n");
	if (b)
		memmove(body, b + 4, strlen(b + 4) + 1);
	return status;
}

static int http_req(int port, const char *method, const char *path, const char *hdr,
		    char *body, size_t n)
{
	return http_req_from(NULL, port, method, path, hdr, body, n);
}

static int http_get(int port, const char *method, const char *path, char *body, size_t n)
{
	return http_req(port, method, path, NULL, body, n);
}

/* The value of the sample line that starts with `series ` in text. */
/* Every line of a Prometheus text exposition (format 0.0.4) is a HELP or
 * TYPE comment or one sample, `name{label="v",...} value`; "" when body is
 * one, else the first line that is not. Checked here so that a malformed
 * page fails without promtool. */
static const char *exposition_error(const char *body, char *line, size_t len)
{
	regex_t re;
	const char *p = body;

	ck_assert_int_eq(regcomp(&re, "^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+|"
				 "[a-zA-Z_:][a-zA-Z0-9_:]*"
				 "(\\{([a-zA-Z_][a-zA-Z0-9_]*=\"[^\"]*\",?)*\\})? "
				 "(-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?|[-+]Inf|NaN))$",
				 REG_EXTENDED | REG_NOSUB), 0);
	ck_assert_msg(*p, "empty exposition");
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		snprintf(line, len, "%.*s", (int)n, p);
		if (!nl || regexec(&re, line, 0, NULL, 0) != 0) {
			if (!nl)
				snprintf(line, len, "last line without a newline: %.*s", (int)n, p);
			regfree(&re);
			return line;
		}
		p = nl + 1;
	}
	regfree(&re);
	return "";
}

static double metric(const char *text, const char *series)
{
	char pat[200];
	const char *p;

	snprintf(pat, sizeof(pat), "\n%s ", series);
	p = strstr(text, pat);
	return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* Histogram name of a /metrics body as Prometheus reads it: one
 * NAME_bucket line per bucket of common/histo.h, each le a number (the
 * bucket's bound, 2^i us) and the last "+Inf", the bounds increasing and
 * the cumulative counts never falling, the +Inf count equal to
 * NAME_count. */
static void check_histogram(const char *body, const char *name, int shard)
{
	char pat[120];
	const char *p = body;
	double prev_le = -1, prev_n = -1;
	int n = 0;

	snprintf(pat, sizeof(pat), "\n%s_bucket{le=\"", name);
	while ((p = strstr(p, pat))) {
		char *end;
		const char *le = p + strlen(pat);
		double bound, count;

		if (!strncmp(le, "+Inf\"} ", 7)) {
			bound = INFINITY;
			end = (char *)le + 4;
		} else {
			bound = strtod(le, &end);
			ck_assert_msg(end != le && !strncmp(end, "\"} ", 3), "shard %d: %s: bucket %d's "
				      "le is not a number: %.60s", shard, name, n, le);
			ck_assert_msg(fabs(bound - ldexp(1.0, n) * 1e-6) <= 1e-9 * bound, "shard %d: "
				      "%s: bucket %d's le %g, %g due", shard, name, n, bound,
				      ldexp(1.0, n) * 1e-6);
		}
		count = strtod(end + 3, NULL);
		ck_assert_msg(bound > prev_le && count >= prev_n, "shard %d: %s: bucket %d (le %g, "
			      "%g) after le %g, %g", shard, name, n, bound, count, prev_le, prev_n);
		prev_le = bound;
		prev_n = count;
		n++;
		p = end;
	}
	ck_assert_msg(n == PS_HISTO_BUCKETS && isinf(prev_le), "shard %d: %s: %d buckets, the "
		      "last le %g (%d due, the last +Inf)", shard, name, n, prev_le,
		      PS_HISTO_BUCKETS);
	snprintf(pat, sizeof(pat), "%s_count", name);
	ck_assert_msg(metric(body, pat) == prev_n, "shard %d: %s %g, the +Inf bucket %g", shard,
		      pat, metric(body, pat), prev_n);
}

/* A port for stats.http: free, the next one (shard 1's: shard k serves on
 * the port + k) free as well, and neither of them a shard's port p0, p1. */
static int http_port(int p0, int p1)
{
	int hp = -1;

	for (int i = 0; i < 50; i++) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

		hp = tu_free_port();
		if (hp == p0 || hp == p1 || hp + 1 == p0 || hp + 1 == p1) {
			close(fd);
			continue;
		}
		sa.sin_port = htons((uint16_t)(hp + 1));
		ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (ok)
			break;
	}
	return hp;
}

START_TEST(test_metrics_http)
{
	static char body[262144];
	char path[64], cmd[256];
	struct ps_config cfg;
	struct traffic tr = { .cfg = &cfg };
	pthread_t th;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), hp = http_port(p0, p1), st = -1;

	char extra[64];
	snprintf(extra, sizeof(extra), "stats:\n  http: 127.0.0.1:%d\n", hp);
	start_shards(path, &cfg, p0, p1, extra, srv);
	start_traffic(&tr, &th, 20);
	tr.stop = 1;
	pthread_join(th, NULL);
	ck_assert_msg(tr.rc == 0, "traffic: %s", tr.err);

	/* shard 1 serves on the configured port + 1 */
	for (int k = 0; k < 2; k++) {
		st = http_get(hp + k, "GET", "/metrics", body, sizeof(body));
		ck_assert_msg(st == 200, "shard %d /metrics: %d %s", k, st, body);
		char info[64];
		snprintf(info, sizeof(info), "ps_shard_info{shard=\"%d\"", k);
		ck_assert_msg(strstr(body, info), "%s", body);
		double pushes = metric(body, "ps_push_requests_total");
		/* two ranks push every clock to both shards */
		ck_assert_msg(pushes >= 2 * tr.clocks, "pushes %g for %d clocks", pushes, tr.clocks);
		ck_assert_msg(metric(body, "ps_push_latency_seconds_count") == pushes, "%s", body);
		ck_assert_msg(metric(body, "ps_push_latency_seconds_bucket{le=\"+Inf\"}") == pushes,
			      "%s", body);
		ck_assert_msg(metric(body, "ps_pull_latency_seconds_count") ==
			      metric(body, "ps_pull_requests_total"), "%s", body);
		check_histogram(body, "ps_push_latency_seconds", k);
		check_histogram(body, "ps_pull_latency_seconds", k);
		ck_assert_msg(metric(body, "ps_worker_clock{worker=\"1\"}") >= tr.clocks, "%s", body);
		ck_assert_msg(metric(body, "ps_rejected_frames_total") == 0, "%s", body);
		if (k == 0)
			ck_assert_msg(metric(body, "ps_push_raw_bytes_total{codec=\"none\"}") > 0,
				      "%s", body);
		/* a series of each codec, by its config name, pushed or not */
		static const char *const codecs[] = { "none", "fp16", "q8", "topk", "sign" };
		for (int c = 0; c < 5; c++)
			for (int w = 0; w < 2; w++) {
				char series[100];
				snprintf(series, sizeof(series), "ps_push_%s_bytes_total{codec=\"%s\"}",
					 w ? "wire" : "raw", codecs[c]);
				ck_assert_msg(metric(body, series) >= 0, "shard %d: no %s", k, series);
			}
		char bad[512];
		ck_assert_msg(!*exposition_error(body, bad, sizeof(bad)),
			      "shard %d /metrics: not a valid exposition line: '%s'", k, bad);
	}
	if (access("/usr/bin/promtool", X_OK) == 0) {
		char mpath[64];
		ck_assert_int_eq(tu_write_temp(mpath, body), 0);
		snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", mpath);
		int rc = system(cmd);
		unlink(mpath);
		ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "promtool check metrics failed");
	} else {
		printf("SKIP promtool check metrics: /usr/bin/promtool not found "
		       "(Debian package prometheus)\n");
	}
	ck_assert_int_eq(http_get(hp, "GET", "/healthz", body, sizeof(body)), 200);
	ck_assert_str_eq(body, "ok\n");
	/* readiness, without replicas: loaded and listening, as it serves */
	ck_assert_int_eq(http_get(hp, "GET", "/readyz", body, sizeof(body)), 200);
	ck_assert_str_eq(body, "ready\n");
	ck_assert_int_eq(http_get(hp, "GET", "/nope", body, sizeof(body)), 404);
	ck_assert_str_eq(body, "not found: try /metrics, /healthz or /readyz\n");
	ck_assert_int_eq(http_get(hp, "POST", "/metrics", body, sizeof(body)), 405);
	ck_assert_str_eq(body, "only GET\n");

	/* a second shard 0 cannot take the metrics port (nor the shard port):
	 * it exits non-zero instead of running without its endpoint */
	char yaml2[1024], path2[64];
	snprintf(yaml2, sizeof(yaml2),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\n"
		 "slice_bytes: 4096\n"
		 "model:\n  tensors:\n    - {name: a, shape: [3000]}\n"
		 "stats:\n  http: 127.0.0.1:%d\n", tu_free_port(), p1, hp);
	ck_assert_int_eq(tu_write_temp(path2, yaml2), 0);
	pid_t dup = tu_start_server(path2, 0);
	ck_assert_int_ne(tu_wait_child(dup), 0);
	unlink(path2);

	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}
END_TEST

/* CPU time (ms) thread tid of process pid has used, or -1. */
static double thread_cpu_ms(pid_t pid, pid_t tid)
{
	char path[96], buf[1024], *p;
	unsigned long ut, st;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
	if (!(f = fopen(path, "r")))
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	if (!(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* A connection to 127.0.0.1:port from 127.0.0.1 that has sent the first
 * line of a request and no more; -1 when refused. */
static int slow_conn(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	static const char line[] = "GET /healthz HTTP/1.1\r\n";
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    write(fd, line, strlen(line)) != (ssize_t)strlen(line)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* /metrics and the Stats reply say the same: each figure both give (but
 * the bytes queued this instant), read from each shard at rest after
 * dense pushes (fp16) and pulls by two workers, row pushes and pulls of
 * table e and a refused push. A figure /metrics takes from the wrong
 * counter, or prints under another name or label, fails here. */
START_TEST(test_metrics_match_stats)
{
	static char body[262144];
	char path[64], extra[256], err[512], series[160];
	struct ps_config cfg;
	struct ps_shard_stats st;
	struct traffic tr = { .cfg = &cfg };
	pthread_t th;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), hp = http_port(p0, p1);
	enum { NID = 50, DIM = 4 };
	static const char *const codecs[] = { "none", "fp16", "q8", "topk", "sign" };

	snprintf(extra, sizeof(extra),
		 "  embeddings:\n    - {name: e, dim: %d, admission: 2}\n"
		 "compression:\n  codec: fp16\nstats:\n  http: 127.0.0.1:%d\n", DIM, hp);
	start_shards(path, &cfg, p0, p1, extra, srv);
	start_traffic(&tr, &th, 5);
	tr.stop = 1;
	pthread_join(th, NULL);
	ck_assert_msg(tr.rc == 0, "traffic: %s", tr.err);
	/* rows: both workers push table e for a clock (twice each id: the
	 * filter admits it at its second sighting), then a pull */
	struct ps_client *c[2];
	uint64_t ids[NID];
	static float g[NID * DIM], a[3000], out[NID * DIM];
	struct ps_tensor ta = { .name = "a", .data = a, .count = 3000 };
	for (int i = 0; i < NID; i++)
		ids[i] = (uint64_t)i * 7919 + 1;
	for (int r = 0; r < 2; r++)
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
	uint64_t k = ps_client_clock(c[0]);
	for (int n = 0; n < 2; n++, k++)
		for (int r = 0; r < 2; r++) {
			ck_assert_msg(ps_client_push_rows(c[r], "e", k, ids, NID, g, 0) == 0, "%s",
				      ps_client_error(c[r]));
			int64_t q = ps_client_push(c[r], k, &ta, 1, PS_PUSH_END_CLOCK);
			ck_assert_msg(q > 0 && ps_client_wait(c[r], q) == 0, "%s",
				      ps_client_error(c[r]));
		}
	ck_assert_msg(ps_client_pull_rows(c[0], "e", k, ids, NID, out) == 0, "%s",
		      ps_client_error(c[0]));
	/* a push of a clock ended already: refused (an error counted) */
	ck_assert_int_lt(ps_client_wait(c[1], ps_client_push(c[1], 0, &ta, 1, 0)), 0);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);

	struct ps_client *mon;
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	for (int sh = 0; sh < 2; sh++) {
		ck_assert_msg(ps_client_stats(mon, sh, &st) == 0, "%s", ps_client_error(mon));
		ck_assert_int_eq(http_get(hp + sh, "GET", "/metrics", body, sizeof(body)), 200);
		const struct { const char *name; double v; } same[] = {
			{ "ps_push_requests_total", (double)st.pushes },
			{ "ps_pull_requests_total", (double)st.pulls },
			{ "ps_received_bytes_total", (double)st.bytes_in },
			{ "ps_sent_bytes_total", (double)st.bytes_out },
			{ "ps_pull_raw_bytes_total", (double)st.pull_raw_bytes },
			{ "ps_pull_wire_bytes_total", (double)st.pull_wire_bytes },
			{ "ps_optimizer_steps_total", (double)st.applies },
			{ "ps_optimizer_bytes_total", (double)st.apply_bytes },
			{ "ps_request_errors_total", (double)st.errors },
			{ "ps_rejected_frames_total", (double)st.rejected_frames },
			{ "ps_auth_failures_total", (double)st.auth_failures },
			{ "ps_duplicate_pushes_total", (double)st.duplicate_pushes },
			{ "ps_reader_refused_total", (double)st.reader_refused },
			{ "ps_connections", (double)st.connections },
			{ "ps_reply_queue_peak_bytes", (double)st.reply_queue_peak },
			{ "ps_reply_queue_total_peak_bytes", (double)st.reply_queue_total_peak },
			{ "ps_paused_connections", (double)st.paused_connections },
			{ "ps_max_clock_gap", (double)st.max_clock_gap },
			{ "ps_map_epoch", (double)st.map_epoch },
			{ "ps_reshard_bytes_in_total", (double)st.reshard_in_bytes },
			{ "ps_reshard_slices_in_total", (double)st.reshard_in_slices },
			{ "ps_reshard_rows_in_total", (double)st.reshard_in_rows },
			{ "ps_table_rows{table=\"e\"}", (double)st.tables[0].rows },
			{ "ps_table_bytes{table=\"e\"}", (double)st.tables[0].bytes },
			{ "ps_table_admitted_total{table=\"e\"}", (double)st.tables[0].admitted },
			{ "ps_table_evicted_total{table=\"e\"}", (double)st.tables[0].evicted },
			{ "ps_table_expired_total{table=\"e\"}", (double)st.tables[0].expired },
			{ "ps_table_filter_ids{table=\"e\"}", (double)st.tables[0].filter_ids },
			{ "ps_table_filter_bytes{table=\"e\"}", (double)st.tables[0].filter_bytes },
			{ "ps_table_pulled_rows_total{table=\"e\"}", (double)st.tables[0].pulled_rows },
			{ "ps_table_pushed_rows_total{table=\"e\"}", (double)st.tables[0].pushed_rows },
		};
		for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
			double m = metric(body, same[i].name);
			ck_assert_msg(m == same[i].v, "shard %d: /metrics %s %g, the Stats %g", sh,
				      same[i].name, m, same[i].v);
		}
		for (int cd = 0; cd < 5; cd++)
			for (int w = 0; w < 2; w++) {
				snprintf(series, sizeof(series), "ps_push_%s_bytes_total{codec=\"%s\"}",
					 w ? "wire" : "raw", codecs[cd]);
				double v = (double)(w ? st.push_wire_bytes[cd] : st.push_raw_bytes[cd]);
				ck_assert_msg(metric(body, series) == v, "shard %d: /metrics %s %g, the "
					      "Stats %g", sh, series, metric(body, series), v);
			}
		for (int r = 0; r < 2; r++) {
			snprintf(series, sizeof(series), "ps_worker_clock{worker=\"%d\"}", r);
			ck_assert_msg(metric(body, series) == (double)st.worker_clock[r], "shard %d: %s",
				      sh, series);
			snprintf(series, sizeof(series), "ps_worker_connected{worker=\"%d\"}", r);
			ck_assert_msg(metric(body, series) == (double)st.worker_up[r], "shard %d: %s",
				      sh, series);
		}
		double hr = st.tables[0].filter_lookups
			? (double)st.tables[0].filter_hits / (double)st.tables[0].filter_lookups : 0;
		ck_assert_msg(fabs(metric(body, "ps_table_filter_hit_ratio{table=\"e\"}") - hr) < 1e-12,
			      "shard %d: the filter's hit ratio", sh);
		ck_assert_msg(fabs(metric(body, "ps_optimizer_seconds_total") - st.apply_seconds) <
			      1e-6 * (1 + st.apply_seconds), "shard %d: optimizer seconds", sh);
		double up = metric(body, "ps_uptime_seconds");
		ck_assert_msg(up >= st.uptime_s - 1 && up <= st.uptime_s + 5, "shard %d: uptime %g "
			      "against the Stats %g", sh, up, st.uptime_s);
		/* and what was done shows: not a page of zeros */
		ck_assert_msg(st.pushes > 0 && st.pulls > 0 && st.push_wire_bytes[1] > 0 &&
			      st.tables[0].pushed_rows > 0 && st.errors > 0, "shard %d: pushes %llu, "
			      "pulls %llu, fp16 bytes %llu, rows pushed %llu, errors %llu", sh,
			      (unsigned long long)st.pushes, (unsigned long long)st.pulls,
			      (unsigned long long)st.push_wire_bytes[1],
			      (unsigned long long)st.tables[0].pushed_rows,
			      (unsigned long long)st.errors);
	}
	ps_client_free(mon);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}
END_TEST

/* The endpoint is held by nobody (docs/security.md): 64 connections from
 * one address, each trickling its request header a byte at a time, leave
 * /healthz answering another address at once (they used to take every
 * one of the 64 slots), and the shard cuts each of them once its header
 * is 5 s late, bytes coming or not (they used to stay while bytes came);
 * 2,000 /healthz requests cost the shard's loop thread next to nothing
 * (each used to render the whole metrics page on it: about 70 us each). */
START_TEST(test_metrics_http_held)
{
	enum { SLOW = 64, PROBES = 2000 };
	static char body[4096];
	char path[64], extra[64];
	struct ps_config cfg;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), hp = http_port(p0, p1);
	int fds[SLOW], st = -1, open_now = 0;

	snprintf(extra, sizeof(extra), "stats:\n  http: 127.0.0.1:%d\n", hp);
	start_shards(path, &cfg, p0, p1, extra, srv);
	for (int i = 0; i < 100 && (st = http_get(hp, "GET", "/healthz", body, sizeof(body))) != 200;
	     i++)
		tu_sleep_ms(50);
	ck_assert_int_eq(st, 200);

	double t0 = ps_now_s();
	for (int i = 0; i < SLOW; i++)
		fds[i] = slow_conn(hp);
	st = http_req_from("127.0.0.2", hp, "GET", "/healthz", NULL, body, sizeof(body));
	ck_assert_msg(st == 200, "/healthz from 127.0.0.2 while 127.0.0.1 holds %d connections: %d",
		      SLOW, st);
	ck_assert_str_eq(body, "ok\n");
	/* a byte every 200 ms to each: every one is closed by the shard by
	 * the deadline (5 s) and a beat or two after it */
	double until = t0 + (5.0 + 3.0) * tu_time_scale();
	do {
		tu_sleep_ms(200);
		open_now = 0;
		for (int i = 0; i < SLOW; i++) {
			char b;
			if (fds[i] < 0)
				continue;
			ssize_t r = recv(fds[i], &b, 1, MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
			    send(fds[i], "X", 1, MSG_NOSIGNAL) != 1) {
				close(fds[i]);
				fds[i] = -1;
				continue;
			}
			open_now++;
		}
	} while (open_now && ps_now_s() < until);
	ck_assert_msg(open_now == 0, "%d slow connections still open %.1f s after they opened",
		      open_now, ps_now_s() - t0);
	ck_assert_msg(ps_now_s() - t0 >= 4.5, "the slow connections were cut after %.1f s, before "
		      "the 5 s deadline", ps_now_s() - t0);
	ck_assert_int_eq(http_get(hp, "GET", "/healthz", body, sizeof(body)), 200);

	/* /healthz does not reach the loop (thread id = pid) */
	double cpu0 = thread_cpu_ms(srv[0], srv[0]);
	ck_assert(cpu0 >= 0);
	for (int i = 0; i < PROBES; i++) {
		st = http_get(hp, "GET", "/healthz", body, sizeof(body));
		ck_assert_msg(st == 200, "probe %d: %d", i, st);
	}
	double loop_ms = thread_cpu_ms(srv[0], srv[0]) - cpu0;
	printf("measured: %d /healthz requests cost the shard's loop thread %.0f ms of CPU\n",
	       PROBES, loop_ms);
	ck_assert_msg(loop_ms <= 40 * tu_time_scale(), "%d /healthz requests took %.0f ms of the "
		      "loop thread's CPU", PROBES, loop_ms);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}
END_TEST

/* Shard k serves /metrics on the configured port + k: shard 1 of a
 * cluster whose stats.http port is 65535 would need 65536, so it stops at
 * start (status 1) saying so, and shard 0 starts. */
START_TEST(test_metrics_port_past_65535)
{
	char path[64];
	struct ps_config cfg;
	pid_t srv[2];

	tu_capture_begin(); /* before the shards start: their stderr is read */
	start_shards(path, &cfg, tu_free_port(), tu_free_port(),
		     "stats:\n  http: 127.0.0.1:65535\n", srv);
	int st1 = tu_wait_child(srv[1]);
	/* shard 0 is up and answers (stopping it before its signal handler
	 * is installed would kill it) */
	struct ps_shard_stats sst;
	int up = 0;
	for (int i = 0; i < 200 && !up; i++) {
		struct ps_client *c = NULL;
		char err[512];
		if (ps_client_init(&c, &cfg, -1, err, sizeof(err)) == 0) {
			up = ps_client_stats(c, 0, &sst) == 0;
			ps_client_free(c);
		}
		if (!up)
			tu_sleep_ms(50);
	}
	ck_assert_msg(up, "shard 0 did not answer");
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	char *log = tu_capture_end();
	ck_assert_int_eq(st1, 1);
	ck_assert_msg(strstr(log, "stats.http '127.0.0.1:65535': shard 1 would serve on port "
			     "65536, outside 1..65535"), "%s", log);
	free(log);
	unlink(path);
}
END_TEST

/* stats.token_file: /metrics answers 401 without the bearer token or with
 * another one, 200 with it; /healthz stays open; a token file others may
 * read stops the shard at start, saying why. */
START_TEST(test_metrics_token)
{
	static char body[262144];
	char path[64], extra[256], tok[64] = "/tmp/ps-test-token-XXXXXX";
	const char *token = "3f1c9a7be2d04c58a6f1e0b7d2c94a1e";
	struct ps_config cfg;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), hp = http_port(p0, p1), st = -1;

	int fd = mkstemp(tok);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, token, strlen(token)), (ssize_t)strlen(token));
	ck_assert_int_eq(write(fd, "\n", 1), 1);
	close(fd);
	snprintf(extra, sizeof(extra), "stats:\n  http: 127.0.0.1:%d\n  token_file: %s\n", hp, tok);
	start_shards(path, &cfg, p0, p1, extra, srv);
	for (int i = 0; i < 100 && (st = http_get(hp, "GET", "/healthz", body, sizeof(body))) != 200;
	     i++)
		tu_sleep_ms(50);
	ck_assert_int_eq(st, 200);
	ck_assert_int_eq(http_get(hp, "GET", "/metrics", body, sizeof(body)), 401);
	ck_assert_msg(strstr(body, "stats.token_file"), "%s", body);
	ck_assert_int_eq(http_req(hp, "GET", "/metrics",
				  "Authorization: Bearer 3f1c9a7be2d04c58a6f1e0b7d2c94a1f", body,
				  sizeof(body)), 401);
	ck_assert_int_eq(http_req(hp, "GET", "/metrics", "Authorization: Bearer 3f1c", body,
				  sizeof(body)), 401);
	char hdr[128];
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", token);
	ck_assert_int_eq(http_req(hp, "GET", "/metrics", hdr, body, sizeof(body)), 200);
	ck_assert_msg(strstr(body, "ps_shard_info{shard=\"0\""), "%s", body);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	/* readable by others: refused at start */
	chmod(tok, 0644);
	pid_t bad = tu_start_server(path, 0);
	ck_assert_int_ne(tu_wait_child(bad), 0);
	unlink(tok);
	unlink(path);
}
END_TEST

/* The 401 page out of memory: shard 0 (started alone, again for each N)
 * with its Nth allocation after "listening" failed by libpsfault.so, N
 * from 1 on until a request makes fewer, among them the page's copy and
 * libmicrohttpd's response. The request without the token gets the 401
 * or no answer (the connection closed), never a crash; then a request
 * with the token gets /metrics. */
START_TEST(test_metrics_401_oom)
{
	static char body[262144];
	char path[64], extra[256], tok[64] = "/tmp/ps-test-token-XXXXXX", lib[512], flog[80];
	char spec[32], hdr[128];
	const char *token = "0c5e8398d5bfffdcaa521cec8b470d63";
	struct ps_config cfg;
	pid_t srv[2];
	int p0 = tu_free_port(), p1 = tu_free_port(), hp = http_port(p0, p1), n, closed = 0;

	if (SANITIZED) {
		tu_skip("the 401 page out of memory: libpsfault.so cannot come before the "
			"sanitizer's runtime");
		return;
	}
	ssize_t ln = readlink("/proc/self/exe", lib, sizeof(lib) - 20);
	ck_assert_int_gt(ln, 0);
	lib[ln] = 0;
	strcpy(strrchr(lib, '/'), "/libpsfault.so");
	int fd = mkstemp(tok);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, token, strlen(token)), (ssize_t)strlen(token));
	close(fd);
	strcpy(flog, "/tmp/ps-test-faults-XXXXXX");
	fd = mkstemp(flog);
	ck_assert_int_ge(fd, 0);
	close(fd);
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s", token);
	snprintf(extra, sizeof(extra), "stats:\n  http: 127.0.0.1:%d\n  token_file: %s\n", hp, tok);
	start_shards(path, &cfg, p0, p1, extra, srv); /* for the config: shard 0 alone below */
	ck_assert(tu_wait_listen(p0) && tu_wait_listen(p1));
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	for (n = 1; n <= 40; n++) {
		int st, ws;

		snprintf(spec, sizeof(spec), "alloc:%d", n);
		truncate(flog, 0);
		setenv("PS_TEST_LOG", "info", 1); /* so that "listening", the marker, is written */
		setenv("LD_PRELOAD", lib, 1);
		setenv("PS_FAULT", spec, 1);
		setenv("PS_FAULT_AFTER", "listening", 1);
		setenv("PS_FAULT_LOG", flog, 1);
		srv[0] = tu_start_server(path, 0);
		unsetenv("LD_PRELOAD");
		unsetenv("PS_FAULT");
		unsetenv("PS_FAULT_AFTER");
		unsetenv("PS_FAULT_LOG");
		unsetenv("PS_TEST_LOG");
		for (int i = 0; i < 200 && !tu_file_count(flog, "armed by"); i++)
			tu_sleep_ms(10);
		ck_assert_msg(tu_file_count(flog, "armed by"), "%s: shard 0 never listened", spec);
		st = http_get(hp, "GET", "/metrics", body, sizeof(body));
		ck_assert_msg(st == 401 || st == -1, "%s: /metrics without the token: HTTP %d", spec,
			      st);
		closed += st == -1;
		ck_assert_msg(waitpid(srv[0], &ws, WNOHANG) == 0, "%s: shard 0 ended (%s %d)", spec,
			      WIFSIGNALED(ws) ? "signal" : "exit",
			      WIFSIGNALED(ws) ? WTERMSIG(ws) : WEXITSTATUS(ws));
		int made = tu_file_count(flog, " call ");
		st = -1;
		for (int t = 0; t < 3 && st != 200; t++) /* a fault still due may close one */
			st = http_req(hp, "GET", "/metrics", hdr, body, sizeof(body));
		ck_assert_msg(st == 200 && strstr(body, "ps_shard_info{shard=\"0\""),
			      "%s: /metrics with the token: HTTP %d", spec, st);
		ck_assert_int_eq(tu_stop_server(srv[0]), 0);
		if (!made)
			break; /* the request made fewer allocations */
	}
	printf("test_metrics_401_oom: %d allocations failed in turn, %d requests closed\n", n - 1,
	       closed);
	ck_assert_msg(n <= 40, "40 faults and still more allocations");
	ck_assert_msg(closed >= 2, "only %d of the faults closed the request", closed);
	unlink(tok);
	unlink(flog);
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("stat");
	TCase *tc = tcase_create("ps-stat");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_stat_live_and_down);
	TU_ADD(tc, test_stat_gap_under_staleness);
	TU_ADD(tc, test_stat_bad_usage);
	TU_ADD(tc, test_metrics_http);
	TU_ADD(tc, test_metrics_match_stats);
	TU_ADD(tc, test_metrics_token);
	TU_ADD(tc, test_metrics_401_oom);
	TU_ADD(tc, test_metrics_http_held);
	TU_ADD(tc, test_metrics_port_past_65535);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
