/* ps_bench.c - push/pull throughput and latency against running shards,
 * each figure also given as a ratio to a raw-TCP baseline of the same size
 * measured in the same run (ping-pong for latency, one stream for
 * throughput), since shared machines are noisy.
 *
 *   ps-bench --config F --op push|pull|pushpull --size BYTES --seconds S
 *            [--inflight K] [--workers W] [--local] [--json]
 *   ps-bench --config F --op pull-rows|push-rows --rows N --dim D --zipf S
 *            [--batch B] ... (bench_rows.c)
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ps_time.h"
#include "auth.h"
#include "bench_rows.h"
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_log.h"
#include "version.h"

enum op { OP_PUSH, OP_PULL, OP_PUSHPULL, OP_PULL_ROWS, OP_PUSH_ROWS };

struct opts {
	const char *config;
	enum op op;
	uint64_t size;
	double seconds;
	int inflight;
	int workers;
	int local;
	int json;
	int baseline;
	struct bench_rows_opts rows; /* --op pull-rows / push-rows */
};

struct worker_res {
	uint64_t ops;
	double *lat;          /* seconds per op */
	size_t nlat, cap;
	int rc;
	char err[512];
};

/* Sync --op push with several workers: nothing else keeps a fast worker
 * within limits.max_clock_ahead of the slowest (the shard refuses a push
 * past it), so each waits before pushing clock c until every worker has
 * had its pushes up to c - max_clock_ahead / 2 acknowledged. */
#define PS_MAX_WORKERS_BENCH 4096
struct lockstep {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t acked[PS_MAX_WORKERS_BENCH]; /* clocks acknowledged; UINT64_MAX once done */
	int n;
};

static void lockstep_set(struct lockstep *l, int rank, uint64_t acked)
{
	pthread_mutex_lock(&l->mu);
	l->acked[rank] = acked;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static void lockstep_wait(struct lockstep *l, uint64_t clock, uint64_t slack)
{
	pthread_mutex_lock(&l->mu);
	for (;;) {
		uint64_t lo = UINT64_MAX;
		for (int w = 0; w < l->n; w++)
			lo = l->acked[w] < lo ? l->acked[w] : lo;
		if (lo == UINT64_MAX || lo + slack > clock)
			break;
		pthread_cond_wait(&l->cv, &l->mu);
	}
	pthread_mutex_unlock(&l->mu);
}

struct worker_arg {
	const struct ps_config *cfg;
	const struct opts *o;
	int rank;
	struct worker_res res;
	pthread_barrier_t *start;
	/* sync: the clock every worker pushes up to (not including), set once
	 * by the first worker whose time is up (UINT64_MAX until then) */
	_Atomic uint64_t *stop_clock;
	struct lockstep *lockstep;   /* sync --op push with several workers, else NULL */
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
	if (!n)
		return NAN;
	size_t i = (size_t)(p * (double)(n - 1) + 0.5);
	return v[i];
}

static void add_lat(struct worker_res *r, double s)
{
	if (r->nlat == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 4096;
		double *v = realloc(r->lat, cap * sizeof(*v));
		if (!v)
			return;
		r->lat = v;
		r->cap = cap;
	}
	r->lat[r->nlat++] = s;
}

/* ---- the parameter-server run ---- */

struct slot {
	int64_t push_id, pull_id;
	uint64_t clock;         /* of the push */
	double t0;
	struct ps_tensor *pt;   /* pull destination, one buffer per tensor */
};

/* Tensors of the model, each backed by a fresh buffer. */
static struct ps_tensor *tensors_new(const struct ps_config *cfg)
{
	struct ps_tensor *t = calloc((size_t)cfg->ntensors, sizeof(*t));

	for (int i = 0; t && i < cfg->ntensors; i++) {
		t[i].name = cfg->tensors[i].name;
		t[i].count = cfg->tensors[i].count;
		t[i].data = malloc((size_t)t[i].count * sizeof(float));
		if (!t[i].data)
			return NULL;
		for (int64_t e = 0; e < t[i].count; e++)
			t[i].data[e] = (float)((e % 7) - 3) * 1e-4f;
	}
	return t;
}

static void tensors_free(const struct ps_config *cfg, struct ps_tensor *t)
{
	for (int i = 0; t && i < cfg->ntensors; i++)
		free(t[i].data);
	free(t);
}

static void *worker_main(void *p)
{
	struct worker_arg *a = p;
	const struct opts *o = a->o;
	const struct ps_config *cfg = a->cfg;
	struct worker_res *res = &a->res;
	struct ps_client *c = NULL;
	struct ps_tensor *grad = tensors_new(cfg);
	struct slot *slots = calloc((size_t)o->inflight, sizeof(*slots));
	int nt = cfg->ntensors, head = 0, nin = 0, rc = 0;
	uint64_t clock = 0;
	double end;

	for (int k = 0; slots && k < o->inflight; k++)
		if (!(slots[k].pt = tensors_new(cfg)))
			rc = -ENOMEM;
	if (!grad || !slots || rc) {
		res->rc = -ENOMEM;
		pthread_barrier_wait(a->start);
		goto out_free;
	}
	/* Local servers may still be starting: retry for a few seconds. */
	for (double t = ps_now_s(); ; usleep(100000)) {
		rc = ps_client_init(&c, cfg, a->rank, res->err, sizeof(res->err));
		if (rc != -ECONNREFUSED || ps_now_s() - t > 10 || !o->local)
			break;
	}
	pthread_barrier_wait(a->start);
	if (rc) {
		res->rc = rc;
		goto out_free;
	}
	end = ps_now_s() + o->seconds;
	/* Keep `inflight` operations outstanding; retire the oldest first.
	 * Sync pushes: a worker's pull of clock c waits for every worker's
	 * push of c, so all must end at the same clock, or the one that
	 * stopped first leaves the others' last pulls waiting until
	 * limits.request_timeout_ms. The first worker whose time is up at
	 * clock k fixes the end at k + inflight: no worker can have submitted
	 * beyond it (each retired its pull of clock c - inflight, which needed
	 * everyone's push of it, before submitting c). Operations submitted
	 * after the time was up are waited for but not counted. */
	int barrier = cfg->consistency == PS_SYNC && o->op != OP_PULL;
	for (;;) {
		int in_time = ps_now_s() < end, submit = in_time;
		if (barrier) {
			uint64_t expect = UINT64_MAX;
			if (!in_time)
				atomic_compare_exchange_strong(a->stop_clock, &expect,
							       clock + (uint64_t)o->inflight);
			submit = clock < atomic_load(a->stop_clock);
		}
		if (nin == o->inflight || (!submit && nin > 0)) {
			struct slot *s = &slots[head];
			/* The pull is answered after the push is applied: waiting
			 * for it first saves a wake-up. */
			if (s->pull_id > 0 && (rc = ps_client_wait(c, s->pull_id)))
				break;
			if (s->push_id > 0 && (rc = ps_client_wait(c, s->push_id)))
				break;
			if (s->t0 < end) {
				if (a->lockstep && s->push_id > 0)
				lockstep_set(a->lockstep, a->rank, s->clock + 1);
			add_lat(res, ps_now_s() - s->t0);
				res->ops++;
			}
			s->push_id = s->pull_id = 0;
			head = (head + 1) % o->inflight;
			nin--;
			continue;
		}
		if (!submit)
			break;
		struct slot *s = &slots[(head + nin) % o->inflight];
		s->t0 = ps_now_s();
		if (o->op == OP_PUSHPULL) {
			/* sync: the pull waits for the clock this push ends */
			uint64_t minv = cfg->consistency == PS_SYNC ? clock + 1 : 0;
			int64_t ids[2];
			rc = ps_client_pushpull(c, clock, grad, nt, PS_PUSH_END_CLOCK, minv, s->pt,
						nt, ids);
			if (rc)
				break;
			s->push_id = ids[0];
			s->pull_id = ids[1];
			clock++;
		} else if (o->op == OP_PUSH) {
			if (a->lockstep)
				lockstep_wait(a->lockstep, clock,
					      (uint64_t)cfg->limits.max_clock_ahead / 2);
			s->clock = clock;
			s->push_id = ps_client_push(c, clock, grad, nt, PS_PUSH_END_CLOCK);
			if (s->push_id < 0) {
				rc = (int)s->push_id;
				break;
			}
			clock++;
		} else {
			s->pull_id = ps_client_pull(c, 0, s->pt, nt);
			if (s->pull_id < 0) {
				rc = (int)s->pull_id;
				break;
			}
		}
		nin++;
	}
	if (rc) {
		res->rc = rc;
		snprintf(res->err, sizeof(res->err), "%s", ps_client_error(c));
	}
out_free:
	if (a->lockstep)  /* the others wait for this worker no more */
		lockstep_set(a->lockstep, a->rank, UINT64_MAX);
	ps_client_free(c);
	for (int k = 0; slots && k < o->inflight; k++)
		tensors_free(cfg, slots[k].pt);
	free(slots);
	tensors_free(cfg, grad);
	return NULL;
}

/* ---- raw TCP baseline ---- */

struct raw_srv {
	int lfd;
	uint64_t size;
	int mode; /* 0 echo, 1 sink */
};

static int read_full(int fd, void *buf, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
	for (size_t put = 0; put < n;) {
		ssize_t r = write(fd, (const char *)buf + put, n - put);
		if (r <= 0)
			return -1;
		put += (size_t)r;
	}
	return 0;
}

static void *raw_server(void *p)
{
	struct raw_srv *s = p;
	int fd = accept(s->lfd, NULL, NULL), one = 1;
	char *buf = malloc(s->mode ? (1u << 20) : s->size);

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (s->mode == 0) {
		while (buf && read_full(fd, buf, s->size) == 0 && write_full(fd, buf, s->size) == 0)
			;
	} else {
		while (buf && read(fd, buf, 1u << 20) > 0)
			;
	}
	free(buf);
	close(fd);
	return NULL;
}

/* Ping-pong (mode 0: p50/p99 seconds) or stream (mode 1: bytes/s). */
static int raw_tcp(uint64_t size, int mode, double seconds, double *a, double *b)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct raw_srv srv = { .size = size, .mode = mode };
	pthread_t th;
	int fd, one = 1, rc = -1;
	char *buf = malloc(size);
	struct worker_res lat = { 0 };

	srv.lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (!buf || srv.lfd < 0 || bind(srv.lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(srv.lfd, 1) || getsockname(srv.lfd, (struct sockaddr *)&sa, &sl))
		goto out;
	pthread_create(&th, NULL, raw_server, &srv);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		goto out_join;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	memset(buf, 1, size);
	double t0 = ps_now_s(), end = t0 + seconds, t;
	uint64_t bytes = 0;
	while ((t = ps_now_s()) < end) {
		if (write_full(fd, buf, size))
			break;
		if (mode == 0) {
			if (read_full(fd, buf, size))
				break;
			add_lat(&lat, ps_now_s() - t);
		}
		bytes += size;
	}
	double el = ps_now_s() - t0;
	shutdown(fd, SHUT_WR);
	close(fd);
	if (mode == 0) {
		qsort(lat.lat, lat.nlat, sizeof(double), cmp_double);
		*a = pct(lat.lat, lat.nlat, 0.5);
		*b = pct(lat.lat, lat.nlat, 0.99);
	} else {
		*a = (double)bytes / el;
	}
	rc = 0;
out_join:
	pthread_join(th, NULL);
out:
	if (srv.lfd >= 0)
		close(srv.lfd);
	free(lat.lat);
	free(buf);
	return rc;
}

/* ---- local servers ---- */

/* A fresh key in a temporary file (mode 0600) named like
 * /tmp/ps-bench-NAME-XXXXXX; its name to path. 0 or -1 (path ""). */
static int temp_key(const char *name, char *path, size_t len)
{
	uint8_t key[32];
	FILE *f;
	int fd;

	snprintf(path, len, "/tmp/ps-bench-%s-XXXXXX", name);
	fd = mkstemp(path); /* mode 0600 */
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		if (fd >= 0)
			close(fd);
		path[0] = 0;
		return -1;
	}
	ps_auth_random(key, sizeof(key));
	for (size_t i = 0; i < sizeof(key); i++)
		fprintf(f, "%02x", key[i]);
	fputc('\n', f);
	if (fclose(f)) {
		unlink(path);
		path[0] = 0;
		return -1;
	}
	return 0;
}

/* The temporary keys make_secret made, removed at the end. */
static char temp_secret[64], temp_repl_key[64];

static void remove_temp_keys(void)
{
	if (temp_secret[0])
		unlink(temp_secret);
	if (temp_repl_key[0])
		unlink(temp_repl_key);
}

/* --local with security.auth on and no secret named: a fresh one that the
 * local shards and the clients share; with cluster.replicas: 1 and no
 * replication key named, a fresh one of those too (the shards alone read
 * it). Removed by remove_temp_keys. 0 or -1. */
static int make_secret(struct ps_config *cfg)
{
	char have[600];

	if (!cfg->security.auth)
		return 0;
	ps_auth_secret_path(cfg, have, sizeof(have));
	if (!have[0] && (temp_key("secret", temp_secret, sizeof(temp_secret)) ||
			 ps_auth_set_secret_file(cfg, temp_secret)))
		return -1;
	ps_auth_repl_key_path(cfg, have, sizeof(have));
	if (cfg->replicas && !have[0] &&
	    (temp_key("replkey", temp_repl_key, sizeof(temp_repl_key)) ||
	     ps_auth_set_repl_key_file(cfg, temp_repl_key)))
		return -1;
	return 0;
}

static pid_t *start_local(const struct ps_config *cfg, const char *self, char *cfgpath)
{
	char dir[1024], exe[1200];
	ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
	int np = cfg->nshards * (1 + cfg->replicas);
	pid_t *pids = calloc((size_t)np, sizeof(pid_t));
	int fd;
	FILE *f;

	(void)self;
	if (n <= 0 || !pids) {
		free(pids);
		return NULL;
	}
	dir[n] = 0;
	*strrchr(dir, '/') = 0;
	snprintf(exe, sizeof(exe), "%s/ps-server", dir);
	strcpy(cfgpath, "/tmp/ps-bench-XXXXXX.yaml");
	fd = mkstemps(cfgpath, 5);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		free(pids);
		return NULL;
	}
	ps_config_dump(cfg, f);
	fclose(f);
	/* with cluster.replicas: 1 the backups too (pids[nshards + k]) */
	for (int i = 0; i < np; i++) {
		char shard[16], replica[16];
		snprintf(shard, sizeof(shard), "%d", i % cfg->nshards);
		snprintf(replica, sizeof(replica), "%d", i / cfg->nshards);
		pids[i] = fork();
		if (pids[i] == 0) {
			execl(exe, exe, "--config", cfgpath, "--shard", shard, "--replica", replica,
			      "--log-level", "warn", (char *)NULL);
			fprintf(stderr, "ps-bench: cannot run %s\n", exe);
			_exit(127);
		}
	}
	return pids;
}

static void stop_local(const struct ps_config *cfg, pid_t *pids, const char *cfgpath)
{
	int np = cfg->nshards * (1 + cfg->replicas);

	if (!pids)
		return;
	for (int k = 0; k < np; k++)
		if (pids[k] > 0)
			kill(pids[k], SIGTERM);
	for (int k = 0; k < np; k++)
		if (pids[k] > 0)
			waitpid(pids[k], NULL, 0);
	unlink(cfgpath);
	free(pids);
}

/* ---- main ---- */

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: ps-bench --config FILE [options]\n"
		"\n"
		"Measures push/pull throughput and latency against the shards of FILE, and\n"
		"a raw TCP baseline over loopback of the same size in the same run; each\n"
		"figure is also printed as a ratio to its baseline.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE    cluster configuration (YAML), required\n"
		"  -o, --op OP          push, pull or pushpull (default pushpull: a push and\n"
		"                       the pull of the clock it ends, sent together with\n"
		"                       ps_client_pushpull); pull-rows or push-rows: rows\n"
		"                       of an embedding table 'bench' (it replaces the\n"
		"                       config's tables), printing rows/s\n"
		"      --rows N         pull-rows/push-rows: distinct ids of the table\n"
		"                       (default 1000000)\n"
		"      --dim D          floats per row (default 16)\n"
		"      --zipf S         ids drawn Zipf(S) over the rows (default 1.05)\n"
		"      --batch B        ids per request (default 106496 = 4096 x 26)\n"
		"      --fp16           push-rows: gradients sent as fp16\n"
		"  -s, --size BYTES     bytes per push or pull (K/M/G suffixes). The model\n"
		"                       becomes one tensor 'bench' of that size: servers\n"
		"                       not started with --local must run the config that\n"
		"                       --dump-config prints with the same flags. Without\n"
		"                       --size, the config's whole model is pushed/pulled.\n"
		"  -t, --seconds S      duration of each measurement (default 3)\n"
		"  -k, --inflight K     operations outstanding per worker (default 1)\n"
		"  -w, --workers W      worker threads, one client each (default: the config's)\n"
		"  -L, --local          start the config's shards here and stop them afterwards\n"
		"                       (with security.auth and no secret named, a temporary\n"
		"                       one is made for them; with cluster.replicas: 1 and no\n"
		"                       replication key named, one of those too)\n"
		"  -j, --json           one JSON object instead of text\n"
		"      --no-baseline    skip the raw TCP baseline\n"
		"      --secret-file F  the cluster secret (default: the config's\n"
		"                       security.secret_file, else $PS_SECRET_FILE)\n"
		"      --dump-config    print the derived configuration and exit\n"
		"  -h, --help           this text\n"
		"      --version        version, wire protocol, rdma and CUDA plug-in of this build\n");
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v = strtod(s, &end);
	uint64_t mul = 1;

	if (end == s || v < 0)
		return -1;
	if (*end == 'K' || *end == 'k')
		mul = 1024, end++;
	else if (*end == 'M' || *end == 'm')
		mul = 1024 * 1024, end++;
	else if (*end == 'G' || *end == 'g')
		mul = 1024ull * 1024 * 1024, end++;
	if (*end == 'i')
		end++;
	if (*end == 'B')
		end++;
	if (*end)
		return -1;
	*out = (uint64_t)(v * (double)mul);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "config", required_argument, NULL, 'c' }, { "op", required_argument, NULL, 'o' },
		{ "size", required_argument, NULL, 's' }, { "seconds", required_argument, NULL, 't' },
		{ "inflight", required_argument, NULL, 'k' }, { "workers", required_argument, NULL, 'w' },
		{ "local", no_argument, NULL, 'L' }, { "json", no_argument, NULL, 'j' },
		{ "no-baseline", no_argument, NULL, 'B' }, { "dump-config", no_argument, NULL, 'D' },
		{ "secret-file", required_argument, NULL, 'K' },
		{ "rows", required_argument, NULL, 'R' }, { "dim", required_argument, NULL, 'd' },
		{ "zipf", required_argument, NULL, 'z' }, { "batch", required_argument, NULL, 'b' },
		{ "fp16", no_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' }, { NULL, 0, NULL, 0 },
	};
	struct opts o = { .op = OP_PUSHPULL, .size = 0, .seconds = 3, .inflight = 1,
			  .baseline = 1, .rows = { .rows = 1000000, .dim = 16, .zipf = 1.05,
						   .batch = 4096 * 26 } };
	struct ps_config *cfg = malloc(sizeof(*cfg));
	char err[1024], cfgpath[64] = "", *end;
	const char *secret = NULL;
	int opt, dump = 0, rc = 1;
	pid_t *pids = NULL;

	if (!cfg)
		return 1;
	while ((opt = getopt_long(argc, argv, "c:o:s:t:k:w:Ljh", lopts, NULL)) != -1) {
		switch (opt) {
		case 'c': o.config = optarg; break;
		case 'o':
			if (!strcmp(optarg, "push")) o.op = OP_PUSH;
			else if (!strcmp(optarg, "pull")) o.op = OP_PULL;
			else if (!strcmp(optarg, "pushpull")) o.op = OP_PUSHPULL;
			else if (!strcmp(optarg, "pull-rows")) o.op = OP_PULL_ROWS;
			else if (!strcmp(optarg, "push-rows")) o.op = OP_PUSH_ROWS;
			else {
				fprintf(stderr, "ps-bench: --op: expected push, pull, pushpull, pull-rows "
					"or push-rows, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 's':
			if (parse_size(optarg, &o.size) || o.size < 4) {
				fprintf(stderr, "ps-bench: --size: expected bytes >= 4 (e.g. 4096, 1M), got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 't':
			o.seconds = strtod(optarg, &end);
			if (*end || !(o.seconds > 0 && o.seconds <= 3600)) {
				fprintf(stderr, "ps-bench: --seconds: expected 0 < S <= 3600, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'k':
			o.inflight = (int)strtol(optarg, &end, 10);
			if (*end || o.inflight < 1 || o.inflight > 1024) {
				fprintf(stderr, "ps-bench: --inflight: expected 1..1024, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'w':
			o.workers = (int)strtol(optarg, &end, 10);
			if (*end || o.workers < 1 || o.workers > 256) {
				fprintf(stderr, "ps-bench: --workers: expected 1..256, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'R':
			o.rows.rows = strtoull(optarg, &end, 10);
			if (*end || o.rows.rows < 1 || o.rows.rows > (1ull << 40)) {
				fprintf(stderr, "ps-bench: --rows: expected 1..2^40, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'd':
			o.rows.dim = (int)strtol(optarg, &end, 10);
			if (*end || o.rows.dim < 1 || o.rows.dim > PS_MAX_ROW_DIM) {
				fprintf(stderr, "ps-bench: --dim: expected 1..%d, got '%s'\n",
					PS_MAX_ROW_DIM, optarg);
				goto err_usage;
			}
			break;
		case 'z':
			o.rows.zipf = strtod(optarg, &end);
			if (*end || !(o.rows.zipf > 0 && o.rows.zipf <= 5)) {
				fprintf(stderr, "ps-bench: --zipf: expected 0 < S <= 5, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'b':
			o.rows.batch = (int)strtol(optarg, &end, 10);
			if (*end || o.rows.batch < 1 || o.rows.batch > (1 << 24)) {
				fprintf(stderr, "ps-bench: --batch: expected 1..2^24, got '%s'\n", optarg);
				goto err_usage;
			}
			break;
		case 'F': o.rows.fp16 = 1; break;
		case 'L': o.local = 1; break;
		case 'j': o.json = 1; break;
		case 'K': secret = optarg; break;
		case 'B': o.baseline = 0; break;
		case 'D': dump = 1; break;
		case 'V': ps__version_print(stdout, "ps-bench"); free(cfg); return 0;
		case 'h': usage(stdout); free(cfg); return 0;
		default: fprintf(stderr, "Try 'ps-bench --help'.\n"); goto err_usage;
		}
	}
	if (!o.config) {
		fprintf(stderr, "ps-bench: --config FILE is required\nTry 'ps-bench --help'.\n");
		goto err_usage;
	}
	if (ps_config_load(cfg, o.config, err, sizeof(err))) {
		fprintf(stderr, "ps-bench: %s\n", err);
		goto err_usage;
	}
	if (secret && ps_auth_set_secret_file(cfg, secret)) {
		fprintf(stderr, "ps-bench: --secret-file: name too long\n");
		goto err_usage;
	}
	if (o.op == OP_PULL_ROWS || o.op == OP_PUSH_ROWS) {
		o.rows.push = o.op == OP_PUSH_ROWS;
		ps_bench_rows_config(cfg, &o.rows);
		if (o.workers)
			cfg->nworkers = o.workers;
		goto rows_ready;
	}
	/* --size: the bench model is one tensor of that many bytes; without
	 * it, the config's own model is pushed and pulled whole. */
	if (!o.size) {
		for (int t = 0; t < cfg->ntensors; t++)
			o.size += (uint64_t)cfg->tensors[t].count * sizeof(float);
		goto model_ready;
	}
	/* the bench tensor replaces the model: a preset or layers would give
	 * the shards --local starts (from the dumped config) their tensors */
	cfg->model.preset[0] = '\0';
	cfg->model.nlayers = 0;
	memset(&cfg->tensors[0], 0, sizeof(cfg->tensors[0]));
	snprintf(cfg->tensors[0].name, sizeof(cfg->tensors[0].name), "bench");
	cfg->tensors[0].ndims = 1;
	cfg->tensors[0].dims[0] = cfg->tensors[0].count = (int64_t)(o.size / 4);
	o.size = o.size / 4 * 4;
	cfg->tensors[0].init = PS_INIT_ZEROS;
	cfg->ntensors = 1;
model_ready:
	if (o.workers)
		cfg->nworkers = o.workers;
	if (o.size + 65536 > cfg->limits.max_frame_bytes)
		cfg->limits.max_frame_bytes = o.size + 65536;
rows_ready:
	if (cfg->limits.max_write_queue < cfg->limits.max_frame_bytes)
		cfg->limits.max_write_queue = cfg->limits.max_frame_bytes;
	if (cfg->limits.max_queued_bytes < cfg->limits.max_write_queue)
		cfg->limits.max_queued_bytes = cfg->limits.max_write_queue;
	if (dump) {
		ps_config_dump(cfg, stdout);
		free(cfg);
		return 0;
	}
	ps_log_init("bench", -1);
	ps_log_set_level(PS_LOG_WARN);
	signal(SIGPIPE, SIG_IGN);
	if (o.local) {
		if (make_secret(cfg)) {
			fprintf(stderr, "ps-bench: cannot make a temporary secret for --local\n");
			remove_temp_keys();
			return 1;
		}
		pids = start_local(cfg, argv[0], cfgpath);
		if (!pids) {
			fprintf(stderr, "ps-bench: cannot start local servers\n");
			remove_temp_keys();
			return 1;
		}
	}

	if (o.op == OP_PULL_ROWS || o.op == OP_PUSH_ROWS) {
		double bw = NAN, dummy;
		o.rows.seconds = o.seconds;
		o.rows.inflight = o.inflight;
		o.rows.local = o.local;
		o.rows.json = o.json;
		/* baseline: a raw TCP stream of one request's row values */
		if (o.baseline)
			raw_tcp((uint64_t)o.rows.batch * (uint64_t)o.rows.dim * 4, 1,
				o.seconds < 2 ? o.seconds : 2, &bw, &dummy);
		rc = ps_bench_rows_run(cfg, &o.rows, bw, stdout) ? 1 : 0;
		stop_local(cfg, pids, cfgpath);
		remove_temp_keys();
		free(cfg);
		return rc;
	}
	int nw = cfg->nworkers;
	_Atomic uint64_t stop_clock = UINT64_MAX;
	static struct lockstep lockstep = { .mu = PTHREAD_MUTEX_INITIALIZER,
					    .cv = PTHREAD_COND_INITIALIZER };
	int use_lockstep = cfg->consistency == PS_SYNC && o.op == OP_PUSH && nw > 1;
	lockstep.n = nw;
	struct worker_arg *wa = calloc((size_t)nw, sizeof(*wa));
	pthread_t *th = calloc((size_t)nw, sizeof(*th));
	pthread_barrier_t start;
	pthread_barrier_init(&start, NULL, (unsigned)nw);
	double t0 = ps_now_s();
	for (int w = 0; w < nw; w++) {
		wa[w].cfg = cfg;
		wa[w].o = &o;
		wa[w].rank = w;
		wa[w].start = &start;
		wa[w].stop_clock = &stop_clock;
		wa[w].lockstep = use_lockstep ? &lockstep : NULL;
		pthread_create(&th[w], NULL, worker_main, &wa[w]);
	}
	for (int w = 0; w < nw; w++)
		pthread_join(th[w], NULL);
	double elapsed = ps_now_s() - t0;
	(void)elapsed;

	struct ps_shard_stats st = { 0 };
	double apply_gbs = NAN;
	/* Server-side apply rate, from shard 0's counters. */
	{
		struct ps_client *mon;
		char e2[256];
		if (ps_client_init(&mon, cfg, -1, e2, sizeof(e2)) == 0) {
			if (ps_client_stats(mon, 0, &st) == 0 && st.apply_seconds > 0)
				apply_gbs = (double)st.apply_bytes / st.apply_seconds / 1e9;
			ps_client_free(mon);
		}
	}
	stop_local(cfg, pids, cfgpath);
	remove_temp_keys();

	uint64_t ops = 0;
	size_t nlat = 0;
	for (int w = 0; w < nw; w++) {
		if (wa[w].res.rc) {
			fprintf(stderr, "ps-bench: worker %d: %s (%s)\n", w, wa[w].res.err,
				ps_strerror(wa[w].res.rc));
			goto out;
		}
		ops += wa[w].res.ops;
		nlat += wa[w].res.nlat;
	}
	double *lat = malloc((nlat ? nlat : 1) * sizeof(double));
	size_t li = 0;
	for (int w = 0; w < nw; w++) {
		memcpy(lat + li, wa[w].res.lat, wa[w].res.nlat * sizeof(double));
		li += wa[w].res.nlat;
	}
	qsort(lat, nlat, sizeof(double), cmp_double);
	double p50 = pct(lat, nlat, 0.5), p99 = pct(lat, nlat, 0.99);
	double bytes_per_op = (double)o.size * (o.op == OP_PUSHPULL ? 2 : 1);
	double gbs = (double)ops * bytes_per_op / o.seconds / 1e9;
	double ops_s = (double)ops / o.seconds;
	double raw_p50 = NAN, raw_p99 = NAN, raw_gbs = NAN;
	if (o.baseline) {
		double bw = NAN, dummy;
		raw_tcp(o.size, 0, o.seconds < 2 ? o.seconds : 2, &raw_p50, &raw_p99);
		raw_tcp(o.size, 1, o.seconds < 2 ? o.seconds : 2, &bw, &dummy);
		raw_gbs = bw / 1e9 * (o.op == OP_PUSHPULL ? 1 : 1);
	}
	static const char *const opname[] = { "push", "pull", "pushpull" };
	if (o.json) {
		/* numbers that could not be measured (no baseline, a pull applies
		 * nothing) are null: the object stays valid JSON */
		char b[10][32];
		printf("{\"op\":\"%s\",\"size\":%" PRIu64 ",\"seconds\":%.3f,\"inflight\":%d,"
		       "\"workers\":%d,\"shards\":%d,\"consistency\":\"%s\",\"optimizer\":\"%s\","
		       "\"ops\":%" PRIu64 ",\"ops_per_s\":%s,\"gb_per_s\":%s,"
		       "\"p50_us\":%s,\"p99_us\":%s,\"raw_p50_us\":%s,\"raw_p99_us\":%s,"
		       "\"raw_gb_per_s\":%s,\"p50_ratio\":%s,\"gb_ratio\":%s,"
		       "\"apply_gb_per_s\":%s}\n",
		       opname[o.op], o.size, o.seconds, o.inflight, nw, cfg->nshards,
		       cfg->consistency == PS_SYNC ? "sync" : "async", ps_optim_name(cfg->optim.kind),
		       ops, ps_bench_jnum(b[0], ops_s, 1), ps_bench_jnum(b[1], gbs, 4),
		       ps_bench_jnum(b[2], p50 * 1e6, 2), ps_bench_jnum(b[3], p99 * 1e6, 2),
		       ps_bench_jnum(b[4], raw_p50 * 1e6, 2), ps_bench_jnum(b[5], raw_p99 * 1e6, 2),
		       ps_bench_jnum(b[6], raw_gbs, 4), ps_bench_jnum(b[7], p50 / raw_p50, 3),
		       ps_bench_jnum(b[8], gbs / raw_gbs, 3), ps_bench_jnum(b[9], apply_gbs, 3));
	} else {
		printf("ps-bench: %s, %" PRIu64 " bytes, %d worker(s), %d shard(s), inflight %d, %s, %s, %.1f s\n",
		       opname[o.op], o.size, nw, cfg->nshards, o.inflight,
		       cfg->consistency == PS_SYNC ? "sync" : "async", ps_optim_name(cfg->optim.kind),
		       o.seconds);
		if (o.baseline) {
			printf("  throughput  %9.3f GB/s payload   raw TCP stream    %7.3f GB/s   ratio %.2f\n",
			       gbs, raw_gbs, gbs / raw_gbs);
			printf("  rate        %9.0f ops/s\n", ops_s);
			printf("  latency p50 %9.1f us             raw TCP ping-pong %7.1f us   ratio %.2f\n",
			       p50 * 1e6, raw_p50 * 1e6, p50 / raw_p50);
			printf("  latency p99 %9.1f us             raw TCP ping-pong %7.1f us   ratio %.2f\n",
			       p99 * 1e6, raw_p99 * 1e6, p99 / raw_p99);
		} else {
			printf("  throughput  %9.3f GB/s payload\n", gbs);
			printf("  rate        %9.0f ops/s\n", ops_s);
			printf("  latency p50 %9.1f us, p99 %.1f us\n", p50 * 1e6, p99 * 1e6);
		}
		if (!isnan(apply_gbs))
			printf("  server apply %8.3f GB/s of gradient (%s, shard 0)\n", apply_gbs,
			       ps_optim_name(cfg->optim.kind));
	}
	free(lat);
	rc = 0;
out:
	for (int w = 0; w < nw; w++)
		free(wa[w].res.lat);
	free(wa);
	free(th);
	free(cfg);
	pthread_barrier_destroy(&start);
	return rc;
err_usage: /* a flag or the config at fault: the message is out */
	free(cfg);
	return 2;
}
