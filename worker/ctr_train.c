/* ctr_train.c - the ctr preset's training loop (ctr_train.h; the model
 * and its requests are ctr_model.c).
 *
 * Which batch at which clock: one shuffled order of the whole click log
 * per epoch, the same on every worker, cut into slots of a batch; at each
 * clock the members take the next slots, one each in rank order
 * (ps_client_members, as worker/epoch.c for the dense models), so every
 * example of an epoch is trained once whoever joins or leaves. The pulls
 * of the next step overlap the push: its batch is guessed as if the
 * members stay, and built again, its rows pulled again, when the pull
 * reply names other members. Gradients are scaled by 1 / (B x the clock's
 * members) in the backward ops: the shards sum the members'.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ctr_int.h"
#include "ctr_train.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"

/* A deterministic shuffle (seed) of order[0..n). */
static void shuffle(int *order, int n, uint64_t seed)
{
	uint64_t s = seed;

	for (int i = n - 1; i > 0; i--) {
		s += 0x9E3779B97F4A7C15ull;
		uint64_t z = s;
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		z ^= z >> 31;
		int j = (int)(z % (uint64_t)(i + 1)), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

/* The epochs' batch slots: epoch e's order is every example once,
 * shuffled by (seed, e) alike on every worker, cut into `slots` batches;
 * global slot g is batch g % slots of epoch g / slots. */
struct slots {
	const struct ps_ctr_data *d;
	int *order;                  /* d->n: the order of epoch `epoch` */
	int epoch;
	long slots;
	uint64_t seed;
	FILE *record;                /* --record-examples, or NULL */
	long slot[2];                /* the slot staged in bags k */
};

/* Builds bags k with slot g's batch. */
static void stage(struct ctr *m, struct slots *sl, int k, long g)
{
	int e = (int)(g / sl->slots);

	if (e != sl->epoch) {
		for (int i = 0; i < sl->d->n; i++)
			sl->order[i] = i;
		shuffle(sl->order, sl->d->n, sl->seed ^ ((uint64_t)(e + 1) << 32));
		sl->epoch = e;
	}
	ps__ctr_build_batch(m, k, sl->d, sl->order, (int)(g % sl->slots) * m->B, m->B);
	sl->slot[k] = g;
}

/* --record-examples: "clock epoch slot example..." of the batch in bags k
 * (a test checks that an epoch trains every example once). */
static void record(const struct ctr *m, const struct slots *sl, int k, uint64_t clock)
{
	long g = sl->slot[k];

	if (!sl->record)
		return;
	fprintf(sl->record, "%llu %ld %ld", (unsigned long long)clock, g / sl->slots, g);
	for (int i = 0; i < m->B; i++)
		fprintf(sl->record, " %d", sl->order[(g % sl->slots) * m->B + i]);
	fputc('\n', sl->record);
	fflush(sl->record);
}

/* One line of the metrics file per epoch. */
static void write_metrics(FILE *f, const struct ctr *m, struct ps_client *cli, int rank, int epoch,
			  int steps, double t, double loss, double sps, double auc, double tloss)
{
	uint64_t given, sent, raw, wire;

	ps_client_push_bytes(cli, &raw, &wire);
	ps_client_rows_bytes(cli, &given, &sent);
	fprintf(f, "{\"rank\":%d,\"epoch\":%d,\"steps\":%d,\"time_s\":%.3f,\"preset\":\"ctr\","
		"\"train_logloss\":%.6f,\"samples_per_s\":%.1f,\"mb_pushed\":%.3f,"
		"\"mb_rows_sent\":%.3f,\"device\":\"%s\",\"consistency\":\"%s\"",
		rank, epoch, steps, t, loss, sps, raw / 1e6, sent / 1e6, m->ops->name,
		m->cfg->consistency == PS_SYNC ? "sync" : "async");
	if (!isnan(tloss))
		fprintf(f, ",\"test_logloss\":%.6f,\"test_auc\":%.6f", tloss, auc);
	fprintf(f, "}\n");
	fflush(f);
}

/* What a worker's part of an epoch counts. */
struct ctr_epoch {
	int e, steps;
	long seen;
	double loss_sum, t0;
};

/* The end of this worker's part of epoch ea->e: its line in the log;
 * rank 0 (not stopped) evaluates the dense weights pulled last (those
 * after the epoch's last clock: the members of a clock take slots in rank
 * order, so rank 0 reaches a new epoch only after every slot of the one
 * before) and prints the held-out AUC; the metrics line. 0, or -1 logged. */
static int epoch_end(struct ctr *m, struct ps_client *cli, const struct ps_ctr_data *test,
		     int rank, FILE *metrics, const struct ctr_epoch *ea, double t_start,
		     int stopped)
{
	double elapsed = ps_now_s() - ea->t0, auc = NAN, tloss = NAN;

	ps_info("epoch %d: %d steps, %ld examples, train logloss %.4f, %.0f samples/s", ea->e + 1,
		ea->steps, ea->seen, ea->seen ? ea->loss_sum / ea->seen : NAN,
		elapsed > 0 ? ea->seen / elapsed : 0.0);
	if (rank == 0 && !stopped) {
		if (ps__ctr_upload_dense(m) || ps__ctr_evaluate(m, cli, test, &auc, &tloss)) {
			ps_error("evaluation: %s / %s", m->c->err, ps_client_error(cli));
			return -1;
		}
		ps_info("epoch %d: test auc %.4f, test logloss %.4f (%d examples)", ea->e + 1, auc,
			tloss, test->n);
		printf("epoch %d test auc %.6f logloss %.6f\n", ea->e + 1, auc, tloss);
		fflush(stdout);
	}
	if (metrics)
		write_metrics(metrics, m, cli, rank, ea->e + 1, ea->steps, ps_now_s() - t_start,
			      ea->seen ? ea->loss_sum / ea->seen : NAN,
			      elapsed > 0 ? ea->seen / elapsed : 0.0, auc, tloss);
	return 0;
}

int ps_ctr_train(const struct ps_config *cfg, int rank, const struct ps_compute_ops *ops,
		 struct ps_compute *c, struct ps_client *cli, FILE *metrics, FILE *rec,
		 volatile sig_atomic_t *stop)
{
	struct ps_ctr_data train = { 0 }, test = { 0 };
	struct ctr m = { 0 };
	struct slots sl = { .epoch = -1, .record = rec, .seed = cfg->seed, .slot = { -1, -1 } };
	int rc = 1, B = cfg->train.batch, E = cfg->train.epochs;
	int sync = cfg->consistency == PS_SYNC;
	char err[1024], tabs[256];

	if (ps_ctr_load(&train, cfg->train.train_file, cfg->train.train_limit, err, sizeof(err)) ||
	    (rank == 0 && ps_ctr_load(&test, cfg->train.test_file, cfg->train.test_limit, err,
				      sizeof(err)))) {
		ps_error("%s", err);
		goto out;
	}
	/* One order of the whole click log per epoch, cut into slots of a
	 * batch; the members of each clock take the next slots, one each in
	 * rank order (ps_client_members), so whoever joins or leaves, every
	 * example of an epoch is trained once (docs/reliability.md). */
	sl.d = &train;
	sl.slots = train.n / B;
	if (sl.slots < 1) {
		ps_error("%d examples give no full batch of %d", train.n, B);
		goto out;
	}
	sl.order = malloc(sizeof(int) * (size_t)train.n);
	if (!sl.order) {
		ps_error("out of memory for the order of %d training examples", train.n);
		goto out;
	}
	if (ps__ctr_init(&m, cfg, ops, c, B, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	ps_info("training ctr (tables %s, %s bags, %d tensors) on %s: %d epoch(s) of %ld "
		"batches of %d among the workers, %s; %d training examples, %d held out",
		ps__ctr_tables_text(&m, tabs, sizeof(tabs)), cfg->model.bag == PS_BAG_MEAN ? "mean" : "sum",
		cfg->ntensors, ops->name, E, sl.slots, B, sync ? "sync" : "async", train.n, test.n);

	/* 0, or the clock of a running cluster this worker joined */
	uint64_t clock = ps_client_clock(cli);
	double t_start = ps_now_s(), last_print = 0;
	int tty = isatty(2), cur = 0, leaving = 0;
	uint64_t leave_at = UINT64_MAX; /* after a stop signal: the clock whose push leaves */
	struct ps_members_info mi;
	struct ctr_epoch ea = { .e = -1 };
	long staged = -1; /* the slot in bags cur, its rows pulled */

	/* the dense weights of the first clock, whose reply names its members */
	if (ps__ctr_pull_start(&m, cli, -1, 1, sync ? clock : 0))
		goto fail_req;
	for (;;) {
		float loss;
		int correct;
		int64_t dpid;

		if (ps__ctr_pull_wait(&m, cli))
			goto fail_req;
		if (ps_client_members(cli, &mi) || mi.index < 0) {
			ps_error("clock %llu: this worker is not among its members",
				 (unsigned long long)clock);
			goto out;
		}
		long g = (long)(mi.before + (uint64_t)mi.index);
		if (g / sl.slots != ea.e) { /* this worker's first slot of a new epoch */
			if (ea.e >= 0 &&
			    epoch_end(&m, cli, &test, rank, metrics, &ea, t_start, *stop))
				goto out;
			if (rank == 0)
				staged = -1; /* the evaluation used the batch buffers */
			ea = (struct ctr_epoch){ .e = (int)(g / sl.slots), .t0 = ps_now_s() };
			last_print = 0;
		}
		if (ea.e >= E) {
			/* done: the clock's other members may still train theirs */
			if (ps_client_leave(cli, clock))
				ps_warn("leaving at clock %llu: %s", (unsigned long long)clock,
					ps_client_error(cli));
			break;
		}
		if (*stop && leave_at == UINT64_MAX) {
			/* this clock's slot is this worker's: trained, and in async
			 * mode with a staleness the clocks the others may be told with
			 * it as a member (ps_client_leave_begin), then it leaves */
			if (ps_client_leave_begin(cli, &leave_at)) {
				ps_warn("leaving: %s; leaving after this clock", ps_client_error(cli));
				leave_at = clock;
			}
			ps_info("stop signal: leaving after clock %llu", (unsigned long long)leave_at);
		}
		leaving = clock >= leave_at;
		if (staged != g) {
			/* the members changed since the batch was guessed */
			stage(&m, &sl, cur, g);
			if (ps__ctr_pull_start(&m, cli, cur, 0, sync ? clock : 0) || ps__ctr_pull_wait(&m, cli))
				goto fail_req;
		}
		record(&m, &sl, cur, clock);
		staged = -1;
		/* the shards sum the members' gradients: each scaled by 1 / (B x
		 * members of this clock) for the mean over the clock's examples */
		if (ps__ctr_upload_dense(&m) || ps__ctr_upload(&m, cur, B) || ps__ctr_forward(&m, B, 1) ||
		    ps__ctr_backward(&m, cur, B, 1.0f / ((float)B * (float)mi.count)) ||
		    ps_compute_xent_read(m.st, 2, &loss, &correct, c->err, sizeof(c->err))) {
			ps_error("clock %llu: %s", (unsigned long long)clock, c->err);
			goto out;
		}
		dpid = ps__ctr_push_start(&m, cli, cur, clock, leaving);
		if (dpid < 0) {
			ps_error("push at clock %llu: %s", (unsigned long long)clock,
				 ps_client_error(cli));
			ps__ctr_push_wait(&m, cli, 0);
			goto out;
		}
		clock++;
		/* the next pulls while the shards apply: with the batch of the
		 * slot this worker gets next if the members stay */
		long next = g + mi.count;
		if (!leaving && next / sl.slots < E) {
			stage(&m, &sl, cur ^ 1, next);
			staged = next;
		}
		if (!leaving && ps__ctr_pull_start(&m, cli, staged >= 0 ? cur ^ 1 : -1, 1,
					   sync ? clock : 0)) {
			ps__ctr_push_wait(&m, cli, dpid);
			goto fail_req;
		}
		if (ps__ctr_push_wait(&m, cli, dpid)) {
			ps_error("push at clock %llu: %s", (unsigned long long)clock - 1,
				 ps_client_error(cli));
			goto out;
		}
		cur ^= 1;
		ea.steps++;
		ea.loss_sum += (double)loss * B;
		ea.seen += B;
		double now = ps_now_s();
		if (now - last_print > (tty ? 0.25 : 10.0)) {
			last_print = now;
			fprintf(stderr, "%sepoch %d/%d  step %d  batch %ld/%ld  %d worker(s)  logloss "
				"%.4f  %.0f samples/s%s", tty ? "\r" : "", ea.e + 1, E, ea.steps,
				g % sl.slots + 1, sl.slots, mi.count, ea.loss_sum / ea.seen,
				ea.seen / (now - ea.t0), tty ? "\033[K" : "\n");
		}
		if (leaving)
			break;
	}
	if (tty)
		fputc('\n', stderr);
	/* stopped by a signal: the epoch so far (no evaluation) */
	if (leaving && ea.seen && epoch_end(&m, cli, &test, rank, metrics, &ea, t_start, 1))
		goto out;
	rc = *stop ? 130 : 0;
	if (*stop)
		ps_info("stopped by signal");
	goto out;
fail_req:
	ps_error("pull at clock %llu: %s", (unsigned long long)clock, ps_client_error(cli));
	ps__ctr_pull_wait(&m, cli);
out:
	ps__ctr_free(&m);
	free(sl.order);
	ps_ctr_data_free(&train);
	ps_ctr_data_free(&test);
	return rc;
}
