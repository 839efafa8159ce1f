/* it_reshard_ops.c - the operations of re-sharding (docs/elastic.md,
 * "Operations"): what ps-stat, /metrics and the Stats show, and the
 * changes refused while another is under way. Real shard processes, one
 * libps client per worker.
 *
 *  - the map epoch: 2 -> 3 -> 2 shards by restart (--reshard-from) with a
 *    worker training between; each new shard's Stats, /metrics and
 *    ps-stat (text and --json) show epoch 1, then 2, and the bytes,
 *    slices and rows it took in equal its "re-sharded from" log line; a
 *    plain restart keeps epoch 2 (from the checkpoint) with nothing moved
 *    in; ps-export reads the files and says epoch 2; old files of two
 *    epochs are refused, both files named; a backup that joins its
 *    re-sharded primary with nothing of its own takes the epoch with the
 *    state and keeps it in its checkpoint;
 *  - one change at a time: a stop prepared by one monitor refuses another
 *    monitor's stop at another clock and `ps-stat --reshard-stop` (shard
 *    and clock named), shows in ps-stat as pending (text and --json); a
 *    worker's join meanwhile is refused and asked again, and completes
 *    once `ps-stat --reshard-cancel` took the stop back; a join holding a
 *    clock refuses a stop (worker and clock named); a stop committed on
 *    one shard only is finished by `ps-stat --reshard-stop`; a shard down
 *    refuses it (shard and address named). /metrics shows the stop's
 *    clock, committed 0 while prepared and 1 once committed.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "test_replica.h"
#include "test_util.h"

#define NA 3000
#define NB 700

static char dir[64];

/* Writes an n-shard config (fresh ports; stats.http on hp + k when hp)
 * with checkpoint.dir ckd to dir/NAME.yaml; its path in out. extra goes
 * under cluster:. */
static void write_cfg(const char *name, int n, int hp, const char *ckd, const char *extra,
		      char *out, size_t len)
{
	char yaml[2048], servers[256] = "", http[64] = "";

	tu_servers_list(n, servers, sizeof(servers));
	if (hp)
		snprintf(http, sizeof(http), "stats:\n  http: 127.0.0.1:%d\n", hp);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n%s"
		 "slice_bytes: 1024\nseed: 5\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "    - {name: b, shape: [%d], init: arange}\n"
		 "limits:\n  drop_timeout_ms: 30000\n  request_timeout_ms: 30000\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\n%slog:\n  level: warn\n",
		 servers, extra, NA, NB, ckd, http);
	tu_write_named(dir, name, yaml, out, len);
}

static pid_t start_shard(const char *path, int k, const char *old, int old_n)
{
	char s[16], n[16], log[200];
	const char *argv[] = { "bin/ps-server", "--config", path, "--shard", s, "--log-level",
			       "info", old ? "--reshard-from" : NULL, old, "--reshard-shards", n,
			       NULL };

	snprintf(s, sizeof(s), "%d", k);
	snprintf(n, sizeof(n), "%d", old_n);
	snprintf(log, sizeof(log), "%s/%s-shard-%d.log", dir, strrchr(path, '/') + 1, k);
	return tu_spawn(argv, log);
}

/* Starts every shard of path (from old's n_old checkpoints when old) and
 * waits until each listens; cfg loaded. */
static void start_all(const char *path, struct ps_config *cfg, pid_t *srv, const char *old,
		      int n_old)
{
	char err[600];

	ck_assert_msg(ps_config_load(cfg, path, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < cfg->nshards; k++)
		srv[k] = start_shard(path, k, old, n_old);
	for (int k = 0; k < cfg->nshards; k++)
		ck_assert_msg(tu_wait_listen(cfg->shards[k].port), "%s: shard %d does not listen",
			      path, k);
}

static void stop_all(const struct ps_config *cfg, const pid_t *srv)
{
	for (int k = 0; k < cfg->nshards; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
}

/* Moves the n shards' checkpoints of ckd into dir/name (its path in to). */
static void move_old(const char *ckd, const char *name, int n, char *to, size_t len)
{
	char a[300], b[300];

	snprintf(to, len, "%s/%s", dir, name);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	for (int k = 0; k < n; k++) {
		snprintf(a, sizeof(a), "%s/shard-%d.ckpt", ckd, k);
		snprintf(b, sizeof(b), "%s/shard-%d.ckpt", to, k);
		ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
	}
}

static void copy_file(const char *from, const char *to)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	char buf[65536];
	size_t n;

	ck_assert_msg(a && b, "%s -> %s: %s", from, to, strerror(errno));
	while ((n = fread(buf, 1, sizeof(buf), a)) > 0)
		ck_assert_uint_eq(fwrite(buf, 1, n, b), n);
	fclose(a);
	ck_assert_int_eq(fclose(b), 0);
}

/* The whole of file path (malloc'ed, NUL-terminated; "" when absent). */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *t;
	long n;

	if (!f)
		return strdup("");
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	t = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(t);
	t[fread(t, 1, (size_t)n, f)] = 0;
	fclose(f);
	return t;
}

/* Runs ps-stat with args (NULL-ended, after --config path); its exit
 * status, and its output (stdout and stderr) in *out (malloc'ed). */
static int ps_stat(const char *path, char **out, const char *a1, const char *a2, const char *a3)
{
	char o[200];
	const char *argv[] = { "bin/ps-stat", "--config", path, a1, a2, a3, NULL };
	int rc;

	snprintf(o, sizeof(o), "%s/ps-stat.out", dir);
	rc = tu_wait_exit(tu_spawn(argv, o));
	*out = slurp(o);
	return rc;
}

/* A worker: `clocks` more clocks of integer gradients (pushed, then
 * pulled), from where the shards are. */
static void train(const struct ps_config *cfg, int clocks)
{
	static float ga[NA], gb[NB], wa[NA], wb[NB];
	struct ps_tensor tg[2] = { { .name = "a", .data = ga, .count = NA },
				   { .name = "b", .data = gb, .count = NB } };
	struct ps_tensor tw[2] = { { .name = "a", .data = wa, .count = NA },
				   { .name = "b", .data = wb, .count = NB } };
	struct ps_client *c = NULL;
	char err[600];
	int rc = -1;

	for (int i = 0; i < 100 && rc; i++) {
		rc = ps_client_init(&c, cfg, 0, err, sizeof(err));
		if (rc)
			tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "%s", err);
	for (int i = 0; i < NA; i++)
		ga[i] = (float)(i % 5) - 2;
	for (int i = 0; i < NB; i++)
		gb[i] = (float)(i % 3) - 1;
	for (int n = 0; n < clocks; n++) {
		uint64_t k = ps_client_clock(c);
		int64_t id = ps_client_push(c, k, tg, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(c));
		id = ps_client_pull(c, k + 1, tw, 2);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull %" PRIu64 ": %s", k,
			      ps_client_error(c));
	}
	ps_client_free(c);
}

/* A GET of /metrics on 127.0.0.1:port: its body (NUL-terminated) in body. */
static void get_metrics(int port, char *body, size_t n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	const char *req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	size_t len = 0;
	ssize_t r;

	ck_assert_msg(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
		      "/metrics on port %d: %s", port, strerror(errno));
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while (len + 1 < n && (r = read(fd, body + len, n - 1 - len)) > 0)
		len += (size_t)r;
	body[len] = 0;
	close(fd);
	ck_assert_msg(strstr(body, " 200 "), "/metrics on port %d: %s", port, body);
}

/* The value of the sample `series` in a /metrics page (NAN: absent). */
static double metric(const char *text, const char *series)
{
	char pat[200];
	const char *p;

	snprintf(pat, sizeof(pat), "\n%s ", series);
	p = strstr(text, pat);
	return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* A port for stats.http with the next n - 1 free as well. */
static int http_base(int n)
{
	for (int i = 0; i < 50; i++) {
		int hp = tu_free_port(), ok = 1;
		for (int k = 1; k < n && ok; k++) {
			struct sockaddr_in sa = { .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)(hp + k)),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
			if (fd >= 0)
				close(fd);
		}
		if (ok)
			return hp;
	}
	ck_abort_msg("no %d free ports in a row for stats.http", n);
	return 0;
}

/* Checks every shard of cfg at map epoch `epoch`, in its Stats and
 * /metrics; with moved, the bytes, slices and rows each took in equal its
 * log line's ("moved in from another shard: S slices, R rows, B bytes"),
 * and the slices are those the two maps give it that old shard of its
 * index (from's) did not hold; else nothing moved in. Returns the bytes
 * moved in, summed. */
static double started; /* when the shards check_epoch reads were started */

static uint64_t check_epoch(const char *path, const struct ps_config *cfg, int hp,
			    uint64_t epoch, int moved, const struct ps_config *from)
{
	static char body[1 << 18];
	struct ps_shard_stats st;
	struct ps_client *mon;
	struct ps_shardmap om, nm;
	char err[600], log[200], name[300];
	uint64_t sum = 0;

	ck_assert_int_eq(ps_client_init(&mon, cfg, -1, err, sizeof(err)), 0);
	if (from) {
		ck_assert_int_eq(ps_shardmap_init(&om, from), 0);
		ck_assert_int_eq(ps_shardmap_init(&nm, cfg), 0);
		ck_assert_uint_eq(om.nslices, nm.nslices);
	}
	for (int k = 0; k < cfg->nshards; k++) {
		uint64_t sl = 0, ro = 0, by = 0;

		ck_assert_msg(ps_client_stats(mon, k, &st) == 0, "%s", ps_client_error(mon));
		ck_assert_uint_eq(st.map_epoch, epoch);
		if (moved) {
			uint64_t clk;
			double secs = -1;
			snprintf(log, sizeof(log), "%s/%s-shard-%d.log", dir, strrchr(path, '/') + 1, k);
			char *text = slurp(log), *p = strstr(text, "moved in from another shard: ");
			ck_assert_msg(p && sscanf(p, "moved in from another shard: %" SCNu64 " slices, %"
						  SCNu64 " rows, %" SCNu64 " bytes; clock %" SCNu64
						  ", %lf s", &sl, &ro, &by, &clk, &secs) == 5,
				      "%s: no re-shard line", log);
			/* the merge's time lies within the test's since the start */
			ck_assert_msg(secs >= 0 && secs <= ps_now_s() - started, "%s: the re-shard took "
				      "%.2f s, in %.2f s since the start", log, secs,
				      ps_now_s() - started);
			free(text);
		}
		ck_assert_uint_eq(st.reshard_in_slices, sl);
		if (from) {
			uint64_t due = 0;
			for (uint32_t i = 0; i < nm.nslices; i++)
				due += nm.slices[i].shard == k && om.slices[i].shard != k;
			ck_assert_msg(sl == due, "shard %d: %" PRIu64 " slices moved in, the maps "
				      "give it %" PRIu64 " that old shard %d did not hold", k, sl, due,
				      k);
		}
		ck_assert_uint_eq(st.reshard_in_rows, ro);
		ck_assert_uint_eq(st.reshard_in_bytes, by);
		get_metrics(hp + k, body, sizeof(body));
		ck_assert_msg(metric(body, "ps_map_epoch") == (double)epoch &&
			      metric(body, "ps_reshards_total") == (double)epoch, "shard %d: %s", k,
			      body);
		ck_assert_msg(metric(body, "ps_reshard_bytes_in_total") == (double)by &&
			      metric(body, "ps_reshard_slices_in_total") == (double)sl &&
			      metric(body, "ps_reshard_rows_in_total") == (double)ro,
			      "shard %d: moved in %" PRIu64 " bytes, %" PRIu64 " slices: %s", k, by,
			      sl, body);
		ck_assert_msg(metric(body, "ps_reshard_stop_clock") == 0, "%s", body);
		sum += by;
	}
	ps_client_free(mon);
	if (from) {
		ps_shardmap_free(&om);
		ps_shardmap_free(&nm);
	}
	/* ps-stat --json: the epoch per shard */
	char *out;
	ck_assert_int_eq(ps_stat(path, &out, "--json", "--interval", "0.1"), 0);
	snprintf(name, sizeof(name), "\"map_epoch\":%" PRIu64 ",", epoch);
	int n = 0;
	for (const char *p = out; (p = strstr(p, name)); p++)
		n++;
	ck_assert_msg(n == cfg->nshards, "ps-stat --json: %d of %d shards at epoch %" PRIu64 ": %s",
		      n, cfg->nshards, epoch, out);
	free(out);
	return sum;
}

START_TEST(test_epoch_2_3_2)
{
	char c2[160], c3[160], c2b[160], cx[160], ck[128], ckx[128], from2[200], from3[200];
	char a[300], b[300], *out;
	static struct ps_config cfg2, cfg3, cfg2b, cfgx;
	pid_t srv[3];
	int hp = http_base(3);

	strcpy(dir, "/tmp/ps-reshard-ops-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	write_cfg("c2", 2, hp, ck, "  workers: 1\n", c2, sizeof(c2));
	start_all(c2, &cfg2, srv, NULL, 0);
	train(&cfg2, 3);
	check_epoch(c2, &cfg2, hp, 0, 0, NULL);
	stop_all(&cfg2, srv);

	/* 2 -> 3: epoch 1, and what moved is what each says it took */
	move_old(ck, "from2", 2, from2, sizeof(from2));
	write_cfg("c3", 3, hp, ck, "  workers: 1\n", c3, sizeof(c3));
	started = ps_now_s();
	start_all(c3, &cfg3, srv, from2, 2);
	ck_assert_msg(check_epoch(c3, &cfg3, hp, 1, 1, &cfg2) > 0,
		      "nothing moved from 2 to 3 shards");
	train(&cfg3, 2);
	stop_all(&cfg3, srv);

	/* 3 -> 2: epoch 2 */
	move_old(ck, "from3", 3, from3, sizeof(from3));
	write_cfg("c2b", 2, hp, ck, "  workers: 1\n", c2b, sizeof(c2b));
	started = ps_now_s();
	start_all(c2b, &cfg2b, srv, from3, 3);
	ck_assert_msg(check_epoch(c2b, &cfg2b, hp, 2, 1, &cfg3) > 0,
		      "nothing moved from 3 to 2 shards");
	ck_assert_int_eq(ps_stat(c2b, &out, "--interval", "0.1", NULL), 0);
	ck_assert_msg(strstr(out, "map epoch") && strstr(out, "\n0              2 ") &&
		      strstr(out, "\n1              2 "), "ps-stat: %s", out);
	free(out);
	train(&cfg2b, 1);
	stop_all(&cfg2b, srv);

	/* a plain restart: epoch 2 from the checkpoint, nothing moved in */
	start_all(c2b, &cfg2b, srv, NULL, 0);
	check_epoch(c2b, &cfg2b, hp, 2, 0, NULL);
	stop_all(&cfg2b, srv);

	/* ps-export reads the files of epoch 2 (version 5) and says so */
	snprintf(a, sizeof(a), "%s/m.npz", dir);
	snprintf(b, sizeof(b), "%s/export.out", dir);
	const char *exp[] = { "bin/ps-export", "--config", c2b, "--out", a, NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(exp, b)), 0);
	out = slurp(a); /* meta.json is stored in the .npz uncompressed */
	long at = 0, n = 0;
	FILE *z = fopen(a, "rb");
	ck_assert_ptr_nonnull(z);
	fseek(z, 0, SEEK_END);
	n = ftell(z);
	fclose(z);
	for (long i = 0; i + 15 < n && !at; i++)
		if (!memcmp(out + i, "\"map_epoch\": 2,", 15))
			at = i;
	ck_assert_msg(at > 0, "%s: no \"map_epoch\": 2 in its meta.json", a);
	free(out);

	/* old files of two epochs (2 and 0): refused, both named */
	snprintf(ckx, sizeof(ckx), "%s/ckx", dir);
	ck_assert_int_eq(mkdir(ckx, 0700), 0);
	snprintf(a, sizeof(a), "%s/mixed", dir);
	ck_assert_int_eq(mkdir(a, 0700), 0);
	snprintf(a, sizeof(a), "%s/shard-0.ckpt", ck);
	snprintf(b, sizeof(b), "%s/mixed/shard-0.ckpt", dir);
	copy_file(a, b);
	snprintf(a, sizeof(a), "%s/shard-1.ckpt", from2);
	snprintf(b, sizeof(b), "%s/mixed/shard-1.ckpt", dir);
	copy_file(a, b);
	write_cfg("cx", 2, 0, ckx, "  workers: 1\n", cx, sizeof(cx));
	char err[600];
	ck_assert_msg(ps_config_load(&cfgx, cx, err, sizeof(err)) == 0, "%s", err);
	snprintf(a, sizeof(a), "%s/mixed", dir);
	ck_assert_int_eq(tu_wait_exit(start_shard(cx, 0, a, 2)), 1);
	snprintf(a, sizeof(a), "%s/cx.yaml-shard-0.log", dir);
	out = slurp(a);
	snprintf(b, sizeof(b), "%s/mixed/shard-1.ckpt is of map epoch 0 (re-sharded that many "
		 "times), %s/mixed/shard-0.ckpt of epoch 2: the old checkpoints are of different "
		 "maps", dir, dir);
	ck_assert_msg(strstr(out, b), "%s: no '%s': %s", a, b, out);
	free(out);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* ---- replicated: the backup takes the epoch from its primary ---- */

/* Shard 0's pair re-sharded from 1 to 1 shard (a re-placement): replica 0
 * starts from the old files (epoch 1), replica 1 from nothing; the
 * snapshot that makes it the backup gives it epoch 1, which its own
 * checkpoint then keeps (a version 5 file). */
START_TEST(test_epoch_replicated)
{
	char path[160], ck[128], extra[160], from[200], a[300], b[300], n1[8], log[200];
	static struct ps_config cfg;
	struct ps_shard_stats st;
	pid_t p[2];

	strcpy(dir, "/tmp/ps-reshard-ops-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	snprintf(extra, sizeof(extra), "  workers: 1\n  replicas: 1\n  backups: [127.0.0.1:%d]\n",
		 tu_free_port());
	write_cfg("r", 1, 0, ck, extra, path, sizeof(path));
	char err[600];
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	for (int r = 0; r < 2; r++)
		p[r] = tu_start_replica(path, dir, 0, r, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, 1, 30) >= 0, "the pair did not form (logs in %s)",
		      dir);
	train(&cfg, 2);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(tu_stop_server(p[r]), 0);
	move_old(ck, "from1", 1, from, sizeof(from));
	snprintf(a, sizeof(a), "%s/shard-0-r1.ckpt", ck);
	snprintf(b, sizeof(b), "%s/shard-0-r1.ckpt", from);
	ck_assert_int_eq(rename(a, b), 0);

	snprintf(n1, sizeof(n1), "1");
	snprintf(log, sizeof(log), "%s/new-r0.log", dir);
	const char *argv[] = { "bin/ps-server", "--config", path, "--shard", "0", "--replica", "0",
			       "--log-level", "info", "--reshard-from", from, "--reshard-shards", n1,
			       NULL };
	p[0] = tu_spawn(argv, log);
	p[1] = tu_start_replica(path, dir, 0, 1, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, 1, 30) >= 0, "the new pair did not form (logs in "
		      "%s)", dir);
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(tu_replica_stats(&cfg, 0, r, -1, &st), 0);
		ck_assert_msg(st.map_epoch == 1, "replica %d: map epoch %" PRIu64 " (logs in %s)", r,
			      st.map_epoch, dir);
	}
	ck_assert_uint_eq(st.reshard_in_bytes, 0); /* the backup moved nothing in */
	train(&cfg, 1);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(tu_stop_server(p[r]), 0);
	char *f = slurp(a);
	ck_assert_msg(!strncmp(f, "PSCKPT05", 8), "%s: a version %.8s file, not 5 (of a state "
		      "re-sharded)", a, f);
	free(f);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* ---- one change at a time ---- */

static struct ps_config lcfg;

struct joiner {
	pthread_t th;
	int rank, rc;
	char err[600];
};

static void *join_thread(void *arg)
{
	struct joiner *j = arg;
	struct ps_client *c = NULL;

	j->rc = ps_client_init(&c, &lcfg, j->rank, j->err, sizeof(j->err));
	if (!j->rc && (j->rc = ps_client_join(c)))
		snprintf(j->err, sizeof(j->err), "%s", ps_client_error(c));
	ps_client_free(c);
	return NULL;
}

/* Only one step of a join or leave (op): MEMBER_HOLD, shard k holds its
 * first open clock for c's rank (a join under way; c's rank left
 * before); MEMBER_FREEZE, shard k counts c's rank up to the clock it
 * names until it leaves (a leave under way). */
static void member_op_only(struct ps_client *c, int k, Ps__MemberOp op)
{
	static struct ps_shard_stats st;
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r = ps__client_req_new(c, REQ_STATS);

	ck_assert_ptr_nonnull(r);
	r->stats = &st;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.member_op = op;
	ck_assert_int_eq(ps__client_pack_part(&r->parts[k], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	ck_assert_int_eq(st.member_status, 0);
}

/* Whether the file at path says `what` within 30 s. */
static int file_says(const char *path, const char *what)
{
	for (int i = 0; i < 300; i++) {
		char *t = slurp(path);
		int said = strstr(t, what) != NULL;
		free(t);
		if (said)
			return 1;
		tu_sleep_ms(100);
	}
	return 0;
}

START_TEST(test_one_change_at_a_time)
{
	char path[160], ck[128], err[600], want[300], *out;
	struct ps_client *ma, *mb, *w2;
	struct ps_shard_stats st;
	struct joiner j = { .rank = 1 }; /* not an initial worker: its init joins */
	pid_t srv[2];

	strcpy(dir, "/tmp/ps-reshard-ops-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	int hp = http_base(2);
	static char body[1 << 18];

	write_cfg("c", 2, hp, ck, "  workers: 3\n  initial_workers: 1\n", path, sizeof(path));
	start_all(path, &lcfg, srv, NULL, 0);
	train(&lcfg, 3); /* rank 0 alone: the shards took clocks 0..2 */

	/* monitor A prepares a stop at 3 on both shards */
	ck_assert_int_eq(ps_client_init(&ma, &lcfg, -1, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_client_init(&mb, &lcfg, -1, err, sizeof(err)), 0);
	/* (first: a worker may not ask one; a clock the shards took a push
	 * for is too early) */
	ck_assert_int_eq(ps_client_init(&w2, &lcfg, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_client_stop_at(w2, 0, 3, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(w2), "a stop for a re-shard is asked by a monitor "
			     "(ps-stat), not by a worker"), "%s", ps_client_error(w2));
	ps_client_free(w2);
	ck_assert_int_eq(ps_client_stop_at(ma, 0, 2, 0, &st), PS_ECLOCK);
	ck_assert_msg(strstr(ps_client_error(ma), "a push for clock 2 was taken already: stop at 3 "
			     "or later"), "%s", ps_client_error(ma));
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(ma, k, 3, 0, &st) == 0, "%s", ps_client_error(ma));
	/* monitor B's stop at another clock is another re-shard */
	ck_assert_int_eq(ps_client_stop_at(mb, 1, 5, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(mb), "another re-shard is in progress: shard 1 holds "
			     "a stop at clock 3 (prepared)"), "%s", ps_client_error(mb));
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-stop", NULL, NULL), 1);
	ck_assert_msg(strstr(out, "refused: another re-shard is in progress: shard 0 holds a stop "
			     "at clock 3 (prepared)") && strstr(out, "--reshard-cancel"), "%s", out);
	free(out);
	/* ps-stat shows it pending */
	ck_assert_int_eq(ps_stat(path, &out, "--interval", "0.1", NULL), 0);
	ck_assert_msg(strstr(out, "re-shard stop pending at clock 3 (prepared)"), "%s", out);
	free(out);
	ck_assert_int_eq(ps_stat(path, &out, "--json", "--interval", "0.1"), 0);
	ck_assert_msg(strstr(out, "\"reshard_stop\":{\"clock\":3,\"committed\":false}"), "%s", out);
	free(out);
	/* and /metrics: the stop's clock, not committed */
	for (int k = 0; k < 2; k++) {
		get_metrics(hp + k, body, sizeof(body));
		double sc = metric(body, "ps_reshard_stop_clock");
		double cm = metric(body, "ps_reshard_stop_committed");
		ck_assert_msg(sc == 3 && cm == 0, "shard %d, a stop at 3 prepared: /metrics says "
			      "ps_reshard_stop_clock %g, ps_reshard_stop_committed %g", k, sc, cm);
	}

	/* a join meanwhile waits, asked again, and completes after the
	 * stop is cancelled */
	tu_capture_begin();
	ck_assert_int_eq(pthread_create(&j.th, NULL, join_thread, &j), 0);
	int waited = file_says(tu_capture_path, "worker 1: the join waits: shard 0: a re-shard is "
			       "in progress: this shard stops at clock 3 (prepared)");
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_uint_eq(st.joins, 0);
	ck_assert_int_eq(st.njoining, 0);
	int cancelled = ps_stat(path, &out, "--reshard-cancel", NULL, NULL);
	pthread_join(j.th, NULL);
	free(tu_capture_end());
	ck_assert_msg(waited, "the join was not refused while the stop was pending");
	ck_assert_msg(cancelled == 0 && strstr(out, "shard 1 takes pushes again"), "%s", out);
	free(out);
	ck_assert_msg(j.rc == 0, "join: %s (%s)", j.err, ps_strerror(j.rc));
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stats(mb, k, &st) == 0, "%s", ps_client_error(mb));
		ck_assert_uint_eq(st.stop_at, 0);
		ck_assert_uint_eq(st.joins, 1); /* a member from clock 4 on */
	}

	/* a join holding a clock refuses a stop, on the shard and in ps-stat */
	ck_assert_int_eq(ps_client_init(&w2, &lcfg, 2, err, sizeof(err)), 0); /* joins */
	ck_assert_msg(ps_client_leave(w2, ps_client_clock(w2)) == 0, "%s", ps_client_error(w2));
	member_op_only(w2, 0, PS__MEMBER_OP__MEMBER_HOLD);
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_int_eq(st.njoining, 1);
	ck_assert_int_eq(st.joining[0], 2);
	uint64_t jc = st.joining_clock[0];
	ck_assert_uint_ge(jc, 4);
	snprintf(want, sizeof(want), "worker 2 is joining at clock %" PRIu64 " (it holds that "
		 "clock on shard 0): try again after it", jc);
	ck_assert_int_eq(ps_client_stop_at(ma, 0, 9, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(ma), want), "%s", ps_client_error(ma));
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-stop", NULL, NULL), 1);
	snprintf(want, sizeof(want), "refused: worker 2 is joining at clock %" PRIu64
		 " (shard 0 holds it); try again after it", jc);
	ck_assert_msg(strstr(out, want), "%s", out);
	free(out);
	ck_assert_int_eq(ps_stat(path, &out, "--interval", "0.1", NULL), 0);
	snprintf(want, sizeof(want), "worker 2 joining at clock %" PRIu64, jc);
	ck_assert_msg(strstr(out, want), "%s", out);
	free(out);
	/* the join done, nothing is under way */
	ck_assert_msg(ps_client_join(w2) == 0, "%s", ps_client_error(w2));
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_int_eq(st.njoining, 0);
	ck_assert_uint_eq(st.joins, 3);
	/* a leave begun (the freeze of its first step) refuses a stop as well,
	 * on the shard and in ps-stat */
	member_op_only(w2, 0, PS__MEMBER_OP__MEMBER_FREEZE);
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_int_eq(st.nleaving, 1);
	ck_assert_int_eq(st.leaving[0], 2);
	uint64_t lc = st.leaving_clock[0];
	snprintf(want, sizeof(want), "worker 2 is leaving (it trains up to clock %" PRIu64 " on "
		 "shard 0 until it leaves): try again after it", lc);
	ck_assert_int_eq(ps_client_stop_at(ma, 0, 9, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(ma), want), "'%s' not in '%s'", want,
		      ps_client_error(ma));
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-stop", NULL, NULL), 1);
	snprintf(want, sizeof(want), "refused: worker 2 is leaving (shard 0 counts it at clock %"
		 PRIu64 " until it leaves); try again after it", lc);
	ck_assert_msg(strstr(out, want), "'%s' not in '%s'", want, out);
	free(out);
	ps_client_free(w2);
	/* gone, it still counts (until limits.drop_timeout_ms, 30 s here);
	 * another process of rank 2 connecting gives the leave up */
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0 && st.nleaving == 1, "%s",
		      ps_client_error(mb));
	ck_assert_int_eq(ps_client_init(&w2, &lcfg, 2, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_stats(mb, 0, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_msg(st.nleaving == 0, "worker 2's leave not given up when another process of "
		      "its rank connected");
	ps_client_free(w2);

	/* a stop committed on shard 0 only (a ps-stat that died between its
	 * commits; clock 4 is not closed, so shard 0 waits): ps-stat
	 * --reshard-stop finishes it at that clock */
	uint64_t b = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stats(mb, k, &st) == 0, "%s", ps_client_error(mb));
		b = st.top_clock > b ? st.top_clock : b;
	}
	ck_assert_msg(ps_client_stop_at(ma, 0, b, PS_STOP_COMMIT, &st) == 0, "%s",
		      ps_client_error(ma));
	/* committed: neither moved nor cancelled; a clock out of range refused */
	snprintf(want, sizeof(want), "committed to stop at clock %" PRIu64 " already, not %" PRIu64,
		 b, b + 1);
	ck_assert_int_eq(ps_client_stop_at(ma, 0, b + 1, 0, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(ma), want), "'%s' not in '%s'", want,
		      ps_client_error(ma));
	snprintf(want, sizeof(want), "the stop at clock %" PRIu64 " was committed: the shard exits "
		 "once that clock is reached", b);
	ck_assert_int_eq(ps_client_stop_at(ma, 0, 0, PS_STOP_CANCEL, &st), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(ma), want), "'%s' not in '%s'", want,
		      ps_client_error(ma));
	ck_assert_int_eq(ps_client_stop_at(ma, 1, 1ull << 53, 0, &st), PS_ECLOCK);
	ck_assert_msg(strstr(ps_client_error(ma), "stop_at 9007199254740992 out of range (1 to "
			     "2^53 - 1)"), "%s", ps_client_error(ma));
	ck_assert_msg(ps_client_stats(mb, 1, &st) == 0 && st.stop_at == 0, "shard 1 holds a stop "
		      "at %" PRIu64 " after refusing one out of range", st.stop_at);
	/* ps-stat --reshard-cancel: shard 0's committed stop stays, said so;
	 * shard 1 (no stop) takes pushes; the run ends 1 */
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-cancel", NULL, NULL), 1);
	snprintf(want, sizeof(want), "ps-stat: reshard-cancel: shard 0: the stop at clock %" PRIu64 " was "
		 "committed: the shard exits once that clock is reached", b);
	ck_assert_msg(strstr(out, want) && strstr(out, "ps-stat: reshard-cancel: shard 1 takes "
						 "pushes again") && !strstr(out, "shard 0 takes"),
		      "%s", out);
	free(out);
	/* /metrics of a shard holding a committed stop: 1, as the Stats' bool
	 * (a scrape reads the gauge as a number, not as a truth value) */
	get_metrics(hp, body, sizeof(body));
	double sc = metric(body, "ps_reshard_stop_clock");
	double cm = metric(body, "ps_reshard_stop_committed");
	ck_assert_msg(sc == (double)b && cm == 1, "shard 0, a stop at %" PRIu64 " committed: "
		      "/metrics says ps_reshard_stop_clock %g, ps_reshard_stop_committed %g", b, sc,
		      cm);
	get_metrics(hp + 1, body, sizeof(body));
	cm = metric(body, "ps_reshard_stop_committed");
	ck_assert_msg(cm == 0, "shard 1, no stop committed yet: ps_reshard_stop_committed %g", cm);
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-stop", NULL, NULL), 0);
	snprintf(want, sizeof(want), "shard 0 committed to stop at clock %" PRIu64 " already", b);
	ck_assert_msg(strstr(out, want), "%s", out);
	snprintf(want, sizeof(want), "every shard stops at clock %" PRIu64, b);
	ck_assert_msg(strstr(out, want), "%s", out);
	free(out);
	ck_assert_msg(ps_client_stats(mb, 1, &st) == 0, "%s", ps_client_error(mb));
	ck_assert_msg(st.stop_at == b && st.stop_committed, "shard 1: stop at %" PRIu64 " (%d)",
		      st.stop_at, st.stop_committed);

	/* a shard down: named with its address */
	ps_client_free(ma);
	ps_client_free(mb);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_int_eq(ps_stat(path, &out, "--reshard-stop", NULL, NULL), 1);
	snprintf(want, sizeof(want), "shard 1 (127.0.0.1:%d)", lcfg.shards[1].port);
	ck_assert_msg(strstr(out, want) && strstr(out, "every shard must be up"), "%s", out);
	free(out);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_ops");
	TCase *tc = tcase_create("ops");

	tcase_set_timeout(tc, 180);
	TU_ADD(tc, test_epoch_2_3_2);
	TU_ADD(tc, test_epoch_replicated);
	TU_ADD(tc, test_one_change_at_a_time);
	suite_add_tcase(s, tc);
	/* the pairs' replication key too, when not run by run-tests.sh */
	tu_secret_setup();
	int rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
