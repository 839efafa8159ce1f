/* it_replica_decl.c - tensors and tables declared at run time on a
 * replicated shard (cluster.replicas: 1; server/replica_decl.c): one shard,
 * its two ps-server processes, a config without a model, two workers.
 *
 * The workers declare two dense tensors (rank 0's initial values) and two
 * embedding tables, then train three sync clocks of integer gradients
 * (SGD: every weight and row is its initial value minus the exact sum).
 * The backup holds the declarations (same tables, same checksums) before
 * the primary is killed -9; the new primary serves the declarations and
 * clock 3 with exact sums. The killed process, restarted, joins after the
 * declarations: it gets them in its state transfer, and once the primary
 * is killed again it serves the same tensors and rows, exact. With
 * optimizer groups (and a learning rate set per step), the backup steps
 * with the rates the pushes gave: the same weights, exact after a kill.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NW 2
#define NA 2000     /* floats of tensor w: two slices of 4 KiB */
#define NIDS 30

static char cfg_path[64], logdir[64];
static struct ps_config cfg;
static pid_t srv[2];

static void write_config(void)
{
	char yaml[1024];
	int p0 = tu_low_free_port(0), p1 = tu_low_free_port(p0);

	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n"
		 "  replicas: 1\n  workers: %d\n"
		 "replication:\n  timeout_ms: 1000\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 60000\n",
		 tu_transport_yaml(), tu_host(), p0, tu_host(), p1, NW);
	tu_replica_config(yaml, cfg_path, &cfg, logdir, "/tmp/ps-test-repld-XXXXXX");
}

/* Until one process is the primary with its backup holding the state:
 * which one, or -1 after limit_s. */
static int wait_pair(double limit_s)
{
	return tu_wait_pair(&cfg, 0, limit_s);
}

/* The model: w [NA] and b [5]; rank 0's initial values are small
 * integers, so every sum below is exact. */
static const int64_t dw[] = { NA }, db[] = { 5 };
struct model {
	float w[NA], b[5];
	struct ps_param p[2];
};

static void model_init(struct model *m, int rank)
{
	for (int i = 0; i < NA; i++)
		m->w[i] = rank ? 0.0f : (float)(i % 13 - 6);
	for (int i = 0; i < 5; i++)
		m->b[i] = rank ? 0.0f : (float)(10 * i);
	m->p[0] = (struct ps_param){ "w", 1, dw, m->w };
	m->p[1] = (struct ps_param){ "b", 1, db, m->b };
}

/* emb_a (dim 4, sgd lr 1, zeros) and emb_b (dim 3, sgd lr 0.5, const 10) */
static const struct ps_table_decl decl[2] = {
	{ .name = "emb_a", .dim = 4, .init = "zeros", .optimizer = "sgd", .lr = 1.0f },
	{ .name = "emb_b", .dim = 3, .init = "const", .init_value = 10.0f, .optimizer = "sgd",
	  .lr = 0.5f },
};

/* test_groups_follow_takeover: w in group 0 (sgd lr 1), b in group 1
 * (sgd lr 0.5, set to 0.25 by both workers from clock 1 on), no tables */
static int groups_mode;
static const struct ps_optim_group groups[2] = {
	{ .kind = "sgd", .lr = 1.0f },
	{ .kind = "sgd", .lr = 0.5f },
};
static const int group_of[2] = { 0, 1 };

/* The learning rate of tensor i (0 w, 1 b) at clock k. */
static float dense_lr(int i, uint64_t k)
{
	return groups_mode && i ? (k ? 0.25f : 0.5f) : 1.0f;
}

struct declarer {
	struct ps_client *c;
	struct model *m;
	int rc;
};

static void *declare_thread(void *arg)
{
	struct declarer *d = arg;

	if (groups_mode)
		return d->rc = ps_client_declare_groups(d->c, d->m->p, 2, groups, 2, group_of), NULL;
	d->rc = ps_client_declare(d->c, d->m->p, 2);
	if (!d->rc)
		d->rc = ps_client_declare_tables(d->c, decl, 2);
	return NULL;
}

/* Integer gradients: dense element i and row element j of rank r, clock k. */
static float dgrad(int r, int i, uint64_t k)
{
	return (float)((int)((i * 3 + (int)k * 5 + r * 7) % 9) - 4);
}

static float rgrad(int r, uint64_t id, int j, uint64_t k)
{
	return (float)((int)((id * 7 + (uint64_t)j * 3 + k * 5 + (uint64_t)r * 11) % 9) - 4);
}

static uint64_t row_id(int i)
{
	return (uint64_t)(i + 1) * 1000003u;
}

/* One clock of both workers: rows of both tables (rank 1 the even ids
 * only), then the dense push that ends the clock; every ack awaited. */
static void clock_step(struct ps_client *c[NW], uint64_t k)
{
	/* each rank's own gradients: a push resent after a takeover reads
	 * them again (they stay valid until its ack) */
	static float g[NW][NA], gb[NW][5], rg[NIDS * 4];
	uint64_t ids[NIDS];
	int64_t id[NW][3] = { { 0 } };

	for (int r = 0; r < NW; r++) {
		const struct ps_config *cc = ps_client_config(c[r]);
		if (groups_mode)
			ck_assert_int_eq(ps_client_set_lr(c[r], 1, dense_lr(1, k)), 0);
		for (int t = 0; !groups_mode && t < 2; t++) {
			size_t n = 0;
			for (int i = 0; i < NIDS; i++) {
				if (r == 1 && i % 2)
					continue;
				ids[n] = row_id(i);
				for (unsigned j = 0; j < decl[t].dim; j++)
					rg[n * decl[t].dim + j] = rgrad(r, row_id(i), (int)j, k);
				n++;
			}
			id[r][t] = ps_client_push_rows_async(c[r], decl[t].name, k, ids, n, rg, 0);
			ck_assert_msg(id[r][t] > 0, "rank %d rows: %s", r, ps_client_error(c[r]));
		}
		for (int i = 0; i < NA; i++)
			g[r][i] = dgrad(r, i, k);
		for (int i = 0; i < 5; i++)
			gb[r][i] = dgrad(r, i + 7, k);
		struct ps_tensor t[2] = { ps_tensor_of(cc, 0, g[r]), ps_tensor_of(cc, 1, gb[r]) };
		id[r][2] = ps_client_push(c[r], k, t, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(id[r][2] > 0, "rank %d push: %s", r, ps_client_error(c[r]));
	}
	for (int r = 0; r < NW; r++)
		for (int x = 0; x < 3; x++)
			ck_assert_msg(!id[r][x] || ps_client_wait(c[r], id[r][x]) == 0, "rank %d clock %llu: %s", r,
				      (unsigned long long)k, ps_client_error(c[r]));
}

/* The tensors and rows c reads at version `clocks`: exact sums. */
static void check_exact(struct ps_client *c, uint64_t clocks, const char *what)
{
	const struct ps_config *cc = ps_client_config(c);
	struct model init;
	static float w[NA];
	float b[5], out[NIDS * 4];
	uint64_t ids[NIDS];

	model_init(&init, 0);
	struct ps_tensor t[2] = { ps_tensor_of(cc, 0, w), ps_tensor_of(cc, 1, b) };
	int64_t id = ps_client_pull(c, clocks, t, 2);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s: pull: %s", what,
		      ps_client_error(c));
	for (int i = 0; i < NA + 5; i++) {
		float want = i < NA ? init.w[i] : init.b[i - NA], got = i < NA ? w[i] : b[i - NA];
		int e = i < NA ? i : i - NA + 7;
		for (uint64_t k = 0; k < clocks; k++)
			for (int r = 0; r < NW; r++)
				want -= dense_lr(i >= NA, k) * dgrad(r, e, k);
		ck_assert_msg(got == want, "%s: %s[%d] = %g, %g due (logs in %s)", what,
			      i < NA ? "w" : "b", i < NA ? i : i - NA, (double)got, (double)want,
			      logdir);
	}
	for (int i = 0; i < NIDS; i++)
		ids[i] = row_id(i);
	for (int t = 0; !groups_mode && t < 2; t++) {
		ck_assert_msg(ps_client_pull_rows(c, decl[t].name, clocks, ids, NIDS, out) == 0,
			      "%s: pull %s: %s", what, decl[t].name, ps_client_error(c));
		for (int i = 0; i < NIDS; i++)
			for (unsigned j = 0; j < decl[t].dim; j++) {
				float s = 0;
				for (uint64_t k = 0; k < clocks; k++)
					for (int r = 0; r < NW; r++)
						if (r == 0 || i % 2 == 0)
							s += rgrad(r, row_id(i), (int)j, k);
				float want = (t ? 10.0f : 0.0f) - decl[t].lr * s;
				float got = out[(size_t)i * decl[t].dim + j];
				ck_assert_msg(got == want, "%s: %s row %d [%u] = %g, %g due (logs in %s)",
					      what, decl[t].name, i, j, (double)got, (double)want, logdir);
			}
	}
}

/* Until both processes report every worker's finished clock as `want`;
 * then their dense checksums and every table's name, rows, checksum and
 * epoch must agree. */
static void assert_same(uint64_t want, const char *what)
{
	struct ps_shard_stats st[2];
	double t0 = ps_now_s();
	int ok = 0;

	while (!ok && ps_now_s() - t0 < 10 * tu_time_scale()) {
		ok = 1;
		for (int r = 0; r < 2; r++)
			ok = ok && tu_replica_stats(&cfg, 0, r, -1, &st[r]) == 0 &&
			     st[r].worker_clock[0] == want && st[r].worker_clock[1] == want &&
			     st[r].repl_lsn == st[0].repl_lsn;
		if (!ok)
			tu_sleep_ms(20);
	}
	ck_assert_msg(ok, "%s: the two processes do not both stand at clock %llu (logs in %s)",
		      what, (unsigned long long)want, logdir);
	ck_assert_msg(st[0].param_checksum == st[1].param_checksum, "%s: dense checksums %llx "
		      "and %llx", what, (unsigned long long)st[0].param_checksum,
		      (unsigned long long)st[1].param_checksum);
	ck_assert_int_eq(st[0].ntables, groups_mode ? 0 : 2);
	ck_assert_int_eq(st[1].ntables, groups_mode ? 0 : 2);
	for (int t = 0; !groups_mode && t < 2; t++) {
		ck_assert_str_eq(st[0].tables[t].name, decl[t].name);
		ck_assert_str_eq(st[1].tables[t].name, decl[t].name);
		ck_assert_uint_eq(st[0].tables[t].rows, NIDS);
		ck_assert_uint_eq(st[1].tables[t].rows, NIDS);
		ck_assert_uint_eq(st[0].tables[t].version, st[1].tables[t].version);
		ck_assert_msg(st[0].tables[t].checksum == st[1].tables[t].checksum, "%s: table %s: "
			      "checksums %llx and %llx", what, decl[t].name,
			      (unsigned long long)st[0].tables[t].checksum,
			      (unsigned long long)st[1].tables[t].checksum);
		/* the instant the rows' stamps and ttl count from: the same on
		 * both processes (one host, one wall clock) */
		ck_assert_msg(fabs(st[0].tables[t].epoch_unix - st[1].tables[t].epoch_unix) < 0.5,
			      "%s: table %s: epochs %.3f and %.3f", what, decl[t].name,
			      st[0].tables[t].epoch_unix, st[1].tables[t].epoch_unix);
	}
}

/* Whether replica r's log holds text. */
static int log_has(int r, const char *text)
{
	char path[160];
	static char buf[1 << 20];
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/shard0-r%d.log", logdir, r);
	if ((f = fopen(path, "r"))) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

static void kill_one(int r)
{
	kill(srv[r], SIGKILL);
	tu_wait_child(srv[r]);
	srv[r] = 0;
}

START_TEST(test_declarations_survive_takeovers)
{
	struct ps_client *c[NW];
	struct model m[NW];
	char err[512];

	write_config();
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	for (int r = 0; r < NW; r++) {
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
		model_init(&m[r], r);
	}
	/* rank 1 waits (-EAGAIN) for rank 0's declarations */
	struct declarer d1 = { c[1], &m[1], -1 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	struct declarer d0 = { c[0], &m[0], -1 };
	declare_thread(&d0);
	pthread_join(th, NULL);
	ck_assert_msg(d0.rc == 0, "rank 0: %s", ps_client_error(c[0]));
	ck_assert_msg(d1.rc == 0, "rank 1: %s", ps_client_error(c[1]));
	ck_assert_msg(m[1].w[7] == m[0].w[7] && m[1].b[4] == 40.0f, "rank 1 got w[7] %g, b[4] %g",
		      (double)m[1].w[7], (double)m[1].b[4]);
	for (uint64_t k = 0; k < 3; k++)
		clock_step(c, k);
	check_exact(c[0], 3, "the first primary after 3 clocks");
	assert_same(3, "before the kill");
	/* in a batch: not in a state transfer after a batch was refused
	 * (whose line goes on "adopted from its state") */
	ck_assert_msg(log_has(!p, "the primary's 2 declared tensors adopted (") &&
		      log_has(!p, "the primary's 2 declared tables adopted\n"), "the backup did not "
		      "get the declarations in a batch (logs in %s)", logdir);

	/* the primary killed: the backup serves the declarations */
	kill_one(p);
	clock_step(c, 3);
	check_exact(c[1], 4, "the new primary after clock 3");
	struct ps_shard_stats st;
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, !p, -1, &st), 0);
	ck_assert_int_eq(st.repl_state, 3);
	ck_assert_uint_eq(st.repl_failovers, 1);

	/* the killed process joins after the declarations: its state transfer
	 * carries them; the primary killed again, it serves them */
	srv[p] = tu_start_replica(cfg_path, logdir, 0, p, 1);
	ck_assert_msg(wait_pair(20) == !p, "the restarted process did not join (logs in %s)",
		      logdir);
	assert_same(4, "after the rejoin");
	ck_assert_msg(log_has(p, "declared tensors adopted from its state") &&
		      log_has(p, "declared tables adopted from its state"), "the restarted process "
		      "did not get the declarations in its state transfer (logs in %s)", logdir);
	kill_one(!p);
	clock_step(c, 4);
	check_exact(c[0], 5, "the rejoined process, serving, after clock 4");
	ck_assert_int_eq(tu_replica_stats(&cfg, 0, p, -1, &st), 0);
	ck_assert_int_eq(st.repl_state, 3);
	ck_assert_int_eq(st.ntables, 2);
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	ck_assert_int_eq(tu_stop_server(srv[p]), 0);
	srv[p] = 0;
	unlink(cfg_path);
	tu_rmtree(logdir);
}
END_TEST

/* Declared tensors with optimizer groups: each update the backup applies
 * takes the learning rate the workers' pushes gave (ps_client_set_lr), so
 * both processes hold the same weights and the new primary goes on from
 * them exactly once the first is stopped; the first, restarted, gets the
 * groups in its state transfer and serves exactly once the second is
 * stopped. */
START_TEST(test_groups_follow_takeover)
{
	struct ps_client *c[NW];
	struct model m[NW];
	char err[512];

	groups_mode = 1;
	write_config();
	tu_start_pair(cfg_path, logdir, 0, srv);
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	for (int r = 0; r < NW; r++) {
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
		model_init(&m[r], r);
	}
	struct declarer d1 = { c[1], &m[1], -1 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &d1), 0);
	struct declarer d0 = { c[0], &m[0], -1 };
	declare_thread(&d0);
	pthread_join(th, NULL);
	ck_assert_msg(d0.rc == 0 && d1.rc == 0, "%s / %s", ps_client_error(c[0]),
		      ps_client_error(c[1]));
	for (uint64_t k = 0; k < 3; k++)
		clock_step(c, k);
	check_exact(c[0], 3, "the first primary after 3 clocks with groups");
	assert_same(3, "before the kill, with groups");
	/* the primary stopped (SIGTERM), not killed: it exits through its own
	 * clean-up, so under the sanitizer build LeakSanitizer checks what its
	 * replication batches held (a declaration's copy not freed once its
	 * batch was sent: exit status 23) */
	ck_assert_int_eq(tu_stop_server(srv[p]), 0);
	srv[p] = 0;
	clock_step(c, 3);
	check_exact(c[1], 4, "the new primary after clock 3 with groups");

	/* the stopped process joins after the declaration: its state transfer
	 * must carry the groups with the tensors (without them it would step
	 * b by the config's lr 1, not the pushed 0.25); the other stopped, it
	 * serves clock 4 */
	srv[p] = tu_start_replica(cfg_path, logdir, 0, p, 1);
	ck_assert_msg(wait_pair(20) == !p, "the restarted process did not join (logs in %s)",
		      logdir);
	assert_same(4, "after the rejoin, with groups");
	ck_assert_msg(log_has(p, "declared tensors adopted from its state"), "the restarted "
		      "process did not get the declaration in its state transfer (logs in %s)",
		      logdir);
	ck_assert_int_eq(tu_stop_server(srv[!p]), 0);
	srv[!p] = 0;
	clock_step(c, 4);
	check_exact(c[0], 5, "the rejoined process, serving, after clock 4 with groups");
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	ck_assert_int_eq(tu_stop_server(srv[p]), 0);
	srv[p] = 0;
	unlink(cfg_path);
	tu_rmtree(logdir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("replica_decl");
	TCase *tc = tcase_create("processes");
	int rc;

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_declarations_survive_takeovers);
	TU_ADD(tc, test_groups_follow_takeover);
	suite_add_tcase(s, tc);
	tu_secret_setup();
	rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
