/* it_agree.c - what a worker and its shards must agree on, with real
 * processes: a worker whose config differs in the settings they share
 * (cluster.workers, consistency, optimizer) is refused naming the key and
 * both values; a second live connection of one rank is refused naming the
 * rank, while a restarted worker takes over; a worker that rejoins a sync
 * cluster is accepted at the clock it is told even where some slices went
 * on without it; a killed worker stalls the others for seconds, not a
 * minute; failed authentications are logged, rate-limited, with the
 * peer's address. */
#include <check.h>
#include <inttypes.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include "auth.h"
#include "config.h"
#include "config_agree.h"
#include "msg.h"
#include "shardmap.h"
#include "wire.h"
#include "ps_time.h"
#include "ps_client.h"
#include "ps_err.h"
#include "test_util.h"

/* One shard on a free port; extra is YAML added at the end; with log the
 * shard's stderr goes there. */
struct one {
	char path[64], log[64];
	struct ps_config cfg;
	int port;
	pid_t pid;
};

static void write_yaml(const char *path, int port, int workers, const char *extra)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fprintf(f, "%scluster:\n  servers: [%s:%d]\n  workers: %d\n"
		"slice_bytes: 4096\n"
		"model:\n  tensors:\n"
		"    - {name: a, shape: [1000], init: arange}\n"
		"    - {name: b, shape: [1000], init: arange}\n"
		"%s%s", tu_transport_yaml(), tu_host(), port, workers, extra,
		strstr(extra, "optimizer:") ? "" : "optimizer:\n  name: sgd\n  lr: 0.5\n");
	fclose(f);
}

static void start_one(struct one *o, int workers, const char *extra)
{
	char err[512];

	o->port = tu_free_port();
	ck_assert_int_eq(tu_write_temp(o->path, ""), 0);
	write_yaml(o->path, o->port, workers, extra);
	ck_assert_msg(ps_config_load(&o->cfg, o->path, err, sizeof(err)) == 0, "%s", err);
	strcpy(o->log, "/tmp/ps-agree-log-XXXXXX");
	int fd = mkstemp(o->log);
	ck_assert_int_ge(fd, 0);
	close(fd);
	o->pid = tu_start_server_log(o->path, 0, o->log);
}

static void stop_one(struct one *o)
{
	ck_assert_int_eq(tu_stop_server(o->pid), 0);
	unlink(o->path);
	unlink(o->log);
}

/* ps_client_init of cfg as rank, retried while the shard starts (10 s):
 * its return code; the error into err. */
static int join(const struct ps_config *cfg, int rank, struct ps_client **c, char *err,
		size_t n)
{
	int rc = -1;

	for (int i = 0; i < 100; i++) {
		rc = ps_client_init(c, cfg, rank, err, n);
		if (rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(100);
	}
	return rc;
}

static struct ps_client *join_ok(const struct ps_config *cfg, int rank)
{
	struct ps_client *c = NULL;
	char err[512];

	ck_assert_msg(join(cfg, rank, &c, err, sizeof(err)) == 0, "rank %d: %s", rank, err);
	return c;
}

/* The shard's log (malloc'ed). */
static char *read_log(const char *log)
{
	FILE *f = fopen(log, "rb");
	char *text;
	long n;

	ck_assert_ptr_nonnull(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	text = malloc((size_t)n + 1);
	ck_assert_ptr_nonnull(text);
	n = (long)fread(text, 1, (size_t)n, f);
	text[n] = 0;
	fclose(f);
	return text;
}

/* Waits (10 s at most) until the shard's log says rank left the live set. */
static void wait_dropped(struct one *o, int rank)
{
	char want[64], *log = NULL;
	double t0 = ps_now_s();

	snprintf(want, sizeof(want), "worker %d left the live set", rank);
	for (;;) {
		free(log);
		log = read_log(o->log);
		if (strstr(log, want))
			break;
		ck_assert_msg(ps_now_s() - t0 < 10 * tu_time_scale(), "worker %d never dropped: %s",
			      rank, log);
		tu_sleep_ms(20);
	}
	free(log);
}

static int count_of(const char *text, const char *what)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* A worker whose config differs from the shard's in one setting they
 * share is refused, the refusal naming the key and both values. */
static void expect_refused(struct one *o, const char *key, const char *extra,
			   const char *mine, const char *theirs, int workers)
{
	char wpath[64], err[512];
	struct ps_config wcfg;
	struct ps_client *c = NULL;

	ck_assert_int_eq(tu_write_temp(wpath, ""), 0);
	write_yaml(wpath, o->port, workers, extra);
	ck_assert_msg(ps_config_load(&wcfg, wpath, err, sizeof(err)) == 0, "%s", err);
	int rc = join(&wcfg, 0, &c, err, sizeof(err));
	ck_assert_msg(rc != 0, "a worker with another %s was accepted", key);
	ps_client_free(c);
	ck_assert_msg(strstr(err, key) && strstr(err, mine) && strstr(err, theirs),
		      "the refusal names %s, %s and %s: %s", key, mine, theirs, err);
	unlink(wpath);
}

/* The config of a case of test_every_setting_compared: the base, with
 * one part (cluster, consistency, optimizer, limits, table) replaced. */
struct agree_parts {
	const char *cluster, *consistency, *optimizer, *limits, *table;
};

static void agree_load(struct ps_config *cfg, const struct agree_parts *p)
{
	char yaml[2048], err[512];

	snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1, 127.0.0.1:2], %s}\n"
		 "consistency: %s\noptimizer: %s\nlimits: %s\nmodel:\n  tensors: [{name: w, "
		 "shape: [8]}]\n  embeddings:\n    - {name: e, dim: 4, init: zeros, %s}\n", p->cluster,
		 p->consistency, p->optimizer, p->limits, p->table);
	ck_assert_msg(ps_config_load_string(cfg, yaml, "agree", err, sizeof(err)) == 0, "%s: %s",
		      yaml, err);
}

/* Every setting a worker and its shards share, each differing alone
 * (function level, no process): the shard's comparison refuses it naming
 * the key, the worker's value and its own; with the cluster secret (values
 * sent as keyed digests) it names the key and its own value, and the
 * worker adds its own. A setting only one side sets (those sent only when
 * not the default: dampening, average, initial_workers, the config's
 * tables) is refused whichever side sets it. Equal configs agree. */
START_TEST(test_every_setting_compared)
{
	static const struct agree_parts base = {
		"workers: 4", "{mode: async, staleness: 2}",
		"{name: momentum, lr: 0.5, momentum: 0.9, beta1: 0.9, beta2: 0.999, eps: 1e-8, "
		"weight_decay: 0.01, initial_accumulator: 0.1}",
		"{max_clock_ahead: 64}",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
	};
	static const struct {
		const char *key, *part, *with, *mine, *theirs;
	} c[] = {
		{ "cluster.workers", "cluster", "workers: 3", "4", "3" },
		{ "cluster.replicas", "cluster", "workers: 4, replicas: 1, backups: [127.0.0.1:3, 127.0.0.1:4]",
		  "0", "1" },
		{ "cluster.initial_workers", "cluster", "workers: 4, initial_workers: 2", NULL, "2" },
		{ "consistency.mode", "consistency", "{mode: sync}", "async", "sync" },
		{ "consistency.staleness", "consistency", "{mode: async, staleness: 3}", "2", "3" },
		{ "limits.max_clock_ahead", "limits", "{max_clock_ahead: 65}", "64", "65" },
		{ "optimizer.name", "optimizer", "{name: adam, lr: 0.5, momentum: 0.9, beta1: 0.9, "
		  "beta2: 0.999, eps: 1e-8, weight_decay: 0.01, initial_accumulator: 0.1}", "momentum",
		  "adam" },
		{ "optimizer.lr", "optimizer", "{name: momentum, lr: 0.25, momentum: 0.9, beta1: 0.9, "
		  "beta2: 0.999, eps: 1e-8, weight_decay: 0.01, initial_accumulator: 0.1}", "0.5",
		  "0.25" },
		{ "optimizer.momentum", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.75, "
		  "beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, "
		  "initial_accumulator: 0.1}", "0.899999976", "0.75" },
		{ "optimizer.nesterov", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, "
		  "nesterov: true, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, "
		  "initial_accumulator: 0.1}", "false", "true" },
		{ "optimizer.beta1", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, beta1: 0.5, "
		  "beta2: 0.999, eps: 1e-8, weight_decay: 0.01, initial_accumulator: 0.1}",
		  "0.899999976", "0.5" },
		{ "optimizer.beta2", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, beta1: 0.9, "
		  "beta2: 0.5, eps: 1e-8, weight_decay: 0.01, initial_accumulator: 0.1}",
		  "0.999000013", "0.5" },
		{ "optimizer.eps", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, beta1: 0.9, "
		  "beta2: 0.999, eps: 0.25, weight_decay: 0.01, initial_accumulator: 0.1}",
		  "9.99999994e-09", "0.25" },
		{ "optimizer.weight_decay", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, "
		  "beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.5, "
		  "initial_accumulator: 0.1}", "0.00999999978", "0.5" },
		{ "optimizer.initial_accumulator", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, "
		  "beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, "
		  "initial_accumulator: 0.5}", "0.100000001", "0.5" },
		{ "optimizer.dampening", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, "
		  "beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, "
		  "initial_accumulator: 0.1, dampening: 0.5}", NULL, "0.5" },
		{ "optimizer.average", "optimizer", "{name: momentum, lr: 0.5, momentum: 0.9, "
		  "beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, "
		  "initial_accumulator: 0.1, average: true}", NULL, "true" },
	};
	/* each of a table's settings the digest covers */
	static const char *const tdiff[] = {
		"optimizer: adam, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.25, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-6, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.5, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.5, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.5, l1: 0.5, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.25, l2: 0.25, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.5, ftrl_beta: 1",
		"optimizer: ftrl, lr: 0.5, eps: 1e-8, beta1: 0.9, beta2: 0.999, "
		"initial_accumulator: 0.1, l1: 0.5, l2: 0.25, ftrl_beta: 2",
	};
	uint8_t key[PS_AUTH_KEY_LEN];
	char mine[PS_AGREE_MAX], theirs[PS_AGREE_MAX], wire[PS_AGREE_MAX], err[600], want[300];
	struct ps_config a, b;
	size_t n = sizeof(c) / sizeof(c[0]), nt = sizeof(tdiff) / sizeof(tdiff[0]);

	for (int i = 0; i < PS_AUTH_KEY_LEN; i++)
		key[i] = (uint8_t)(i * 7 + 1);
	agree_load(&a, &base);
	ps_config_agreement(&a, mine, sizeof(mine));
	ck_assert_int_eq(ps_config_agreement_diff(mine, NULL, mine, strlen(mine), 0, "the worker",
						  err, sizeof(err)), 0);
	ps_config_agreement_wire(mine, key, wire, sizeof(wire));
	ck_assert_int_eq(ps_config_agreement_diff(mine, key, wire, strlen(wire), 0, "the worker",
						  err, sizeof(err)), 0);
	for (size_t i = 0; i < n + nt; i++) {
		struct agree_parts p = base;
		const char *k = i < n ? c[i].key : "model.embeddings (optimizers)";

		if (i >= n)
			p.table = tdiff[i - n];
		else if (!strcmp(c[i].part, "cluster"))
			p.cluster = c[i].with;
		else if (!strcmp(c[i].part, "consistency"))
			p.consistency = c[i].with;
		else if (!strcmp(c[i].part, "optimizer"))
			p.optimizer = c[i].with;
		else
			p.limits = c[i].with;
		agree_load(&b, &p);
		ps_config_agreement(&b, theirs, sizeof(theirs));
		/* the worker (b) against the shard (a), and the other way round
		 * as the shard's other process (a partner) would dial it */
		for (int dir = 0; dir < 2; dir++) {
			const char *sh = dir ? theirs : mine, *wk = dir ? mine : theirs;
			const char *peer = dir ? "the partner" : "the worker";
			const char *shv = i < n ? (dir ? c[i].theirs : c[i].mine) : NULL;
			const char *wkv = i < n ? (dir ? c[i].mine : c[i].theirs) : NULL;

			ck_assert_msg(ps_config_agreement_diff(sh, NULL, wk, strlen(wk), 1, peer, err,
							       sizeof(err)) == PS_ECONFIG,
				      "%s differing (%s the peer's) agreed", k, dir ? "a" : "b");
			if (shv && wkv)
				snprintf(want, sizeof(want), "%s: %s has %s, shard 1 has %s; ", k, peer,
					 wkv, shv);
			else if (wkv)
				snprintf(want, sizeof(want), "%s: %s has %s, shard 1 has none", k, peer,
					 wkv);
			else if (shv)
				snprintf(want, sizeof(want), "%s: shard 1 has %s, %s sent none", k, shv,
					 peer);
			else
				snprintf(want, sizeof(want), "%s", k);
			ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s: '%s', expected '%s'",
				      k, err, want);
			/* as digests: the shard's value, or that one side has none */
			ps_config_agreement_wire(wk, key, wire, sizeof(wire));
			ck_assert_int_eq(ps_config_agreement_diff(sh, key, wire, strlen(wire), 1, peer,
								  err, sizeof(err)), PS_ECONFIG);
			if (shv)
				snprintf(want, sizeof(want), "%s: shard 1 has %s", k, shv);
			else
				snprintf(want, sizeof(want), "%s: shard 1 has none", k);
			ck_assert_msg(!strncmp(err, want, strlen(want)) || (!shv && i >= n &&
								 !strncmp(err, k, strlen(k))),
				      "%s (digests): '%s', expected '%s'", k, err, want);
		}
	}
}
END_TEST

/* What the two processes of a replicated shard must share beyond what a
 * worker does (each makes, evicts and expires rows itself): seed (a
 * worker's too, when not the default), limits.max_table_bytes and each of
 * a config table's init, value, admission, ttl, max_rows and filter_ids.
 * Each differing alone is refused as a partner's setting and, the seed
 * apart, accepted as a worker's; the worker's lines are the partner's
 * first. */
/* Writes v over 16 KiB of the stack below the caller: what the locals of
 * the caller's next callee hold before it sets them. */
static __attribute__((noinline)) void stack_fill(int v)
{
	volatile char buf[16384];

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (char)v;
}

START_TEST(test_partner_settings_compared)
{
	static const char *const tbl[] = {
		"init: uniform, scale: 0.5, admission: 2, ttl: 60, max_rows: 1000, filter_ids: 4096",
		"init: normal, scale: 0.5, admission: 2, ttl: 60, max_rows: 1000, filter_ids: 4096",
		"init: uniform, scale: 0.25, admission: 2, ttl: 60, max_rows: 1000, filter_ids: 4096",
		"init: uniform, scale: 0.5, admission: 3, ttl: 60, max_rows: 1000, filter_ids: 4096",
		"init: uniform, scale: 0.5, admission: 2, ttl: 61, max_rows: 1000, filter_ids: 4096",
		"init: uniform, scale: 0.5, admission: 2, ttl: 60, max_rows: 999, filter_ids: 4096",
		"init: uniform, scale: 0.5, admission: 2, ttl: 60, max_rows: 1000, filter_ids: 8192",
	};
	static const char *const top[] = { "seed: 7\n", "seed: 8\n", "seed: 7\n" };
	static const char *const lim[] = { "1GiB", "1GiB", "2GiB" };
	char yaml[2048], err[600], mine[PS_AGREE_MAX], theirs[PS_AGREE_MAX];
	char wmine[PS_AGREE_MAX], wtheirs[PS_AGREE_MAX];
	struct ps_config a, b;
	int ncase = 2 + (int)(sizeof(tbl) / sizeof(tbl[0]) - 1);

	for (int i = 0; i <= ncase; i++) {
		/* case 0: the base; 1, 2: seed, max_table_bytes; then each table key */
		for (int side = 0; side < 2; side++) {
			int k = side ? i : 0;
			snprintf(yaml, sizeof(yaml), "%scluster: {servers: [127.0.0.1:1], workers: 2}\n"
				 "limits: {max_table_bytes: %s}\nmodel:\n  tensors: [{name: w, shape: "
				 "[8]}]\n  embeddings:\n    - {name: e, dim: 4, %s}\n",
				 top[k < 3 ? k : 0], lim[k < 3 ? k : 0], tbl[k >= 3 ? k - 2 : 0]);
			ck_assert_msg(ps_config_load_string(side ? &b : &a, yaml, "agree", err,
							    sizeof(err)) == 0, "%s: %s", yaml, err);
		}
		/* each side's digests made over other stack garbage: they
		 * hash the settings' text, never the bytes after it */
		stack_fill(0x11);
		ps_config_agreement_partner(&a, mine, sizeof(mine));
		stack_fill(0x77);
		ps_config_agreement_partner(&b, theirs, sizeof(theirs));
		stack_fill(0x22);
		ps_config_agreement(&a, wmine, sizeof(wmine));
		stack_fill(0x99);
		ps_config_agreement(&b, wtheirs, sizeof(wtheirs));
		ck_assert_msg(!strncmp(mine, wmine, strlen(wmine)), "case %d: the partner's lines "
			      "do not start with the worker's:\n%s\n%s", i, mine, wmine);
		/* a worker agrees on the seed (the ctr preset's workers cut one
		 * order of the data by it), not on the rest */
		int wrc = ps_config_agreement_diff(wmine, NULL, wtheirs, strlen(wtheirs), 0,
						   "the worker", err, sizeof(err));
		ck_assert_msg(i == 1 ? wrc == PS_ECONFIG &&
				       !strncmp(err, "seed: the worker has 8, shard 0 has 7; ", 39)
				     : wrc == 0, "case %d as a worker's: %d (%s)", i, wrc,
			      wrc ? err : "agreed");
		int rc = ps_config_agreement_diff(mine, NULL, theirs, strlen(theirs), 0, "the partner",
						  err, sizeof(err));
		ck_assert_msg(i ? rc == PS_ECONFIG : rc == 0, "case %d: %d (%s)", i, rc,
			      rc ? err : "agreed");
		const char *key = i == 1 ? "seed: the partner has 8, shard 0 has 7"
				  : i == 2 ? "limits.max_table_bytes: the partner has 2147483648, "
					     "shard 0 has 1073741824"
				  : "model.embeddings (rows): the partner has digest ";
		ck_assert_msg(!i || !strncmp(err, key, strlen(key)), "case %d: '%s', expected '%s'",
			      i, err, key);
	}
}
END_TEST

START_TEST(test_settings_must_agree)
{
	struct one o;

	start_one(&o, 2, "consistency:\n  mode: sync\n");
	expect_refused(&o, "cluster.workers", "consistency:\n  mode: sync\n", "has 3", "has 2", 3);
	expect_refused(&o, "consistency.mode", "consistency:\n  mode: async\n", "async", "sync", 2);
	expect_refused(&o, "optimizer.lr", "consistency:\n  mode: sync\noptimizer:\n  name: sgd\n  lr: 0.25\n",
		       "0.25", "0.5", 2);
	expect_refused(&o, "optimizer.name",
		       "consistency:\n  mode: sync\noptimizer:\n  name: adam\n  lr: 0.5\n", "adam", "sgd", 2);
	/* the same config is accepted */
	struct ps_client *c = join_ok(&o.cfg, 0);
	ps_client_free(c);
	stop_one(&o);
}
END_TEST

/* Two live processes of one rank: the second is refused naming the rank;
 * once the first is gone a new process of that rank takes over. */
START_TEST(test_duplicate_rank_refused)
{
	struct one o;
	struct ps_client *a, *b = NULL;
	char err[512];

	start_one(&o, 2, "consistency:\n  mode: async\n");
	a = join_ok(&o.cfg, 0);
	int rc = join(&o.cfg, 0, &b, err, sizeof(err));
	ck_assert_msg(rc != 0, "a second live worker of rank 0 was accepted");
	ps_client_free(b);
	b = NULL;
	ck_assert_msg(strstr(err, "rank 0") || strstr(err, "worker 0"), "%s", err);
	ck_assert_msg(strstr(err, "already"), "%s", err);
	/* rank 1 is not affected */
	struct ps_client *c1 = join_ok(&o.cfg, 1);
	ps_client_free(c1);
	/* the first one stops (its connection closes): a restart takes over */
	ps_client_free(a);
	b = join_ok(&o.cfg, 0);
	ps_client_free(b);
	stop_one(&o);
}
END_TEST

/* A raw worker Hello of rank on port (security.auth off): the connection,
 * answered ok, which then stays silent (as one whose host died). */
static int raw_worker(const struct ps_config *cfg, int port, int rank)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	static char settings[PS_AGREE_MAX];
	Ps__Hello h = PS__HELLO__INIT;
	struct ps_shardmap map;
	uint8_t buf[4096], hdr[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr fh = { .version = PS_PROTOCOL_VERSION, .type = PS_MSG_HELLO };
	struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 1 << 16 };
	char why[200];

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(ps_shardmap_init(&map, cfg), 0);
	ps_config_agreement(cfg, settings, sizeof(settings));
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = PS__ROLE__ROLE_WORKER;
	h.rank = rank;
	h.shard_map_hash = map.hash;
	h.incarnation = 4242;
	h.settings = settings;
	ps_shardmap_free(&map);
	fh.meta_len = (uint32_t)protobuf_c_message_get_packed_size(&h.base);
	ps_wire_encode_hdr(buf, &fh);
	protobuf_c_message_pack(&h.base, buf + PS_WIRE_HDR_LEN);
	ck_assert_int_eq(write(fd, buf, PS_WIRE_HDR_LEN + fh.meta_len),
			 (ssize_t)(PS_WIRE_HDR_LEN + fh.meta_len));
	/* the HelloReply: ok */
	ck_assert_int_eq(read(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	ck_assert_int_eq(ps_wire_decode_hdr(hdr, &lim, &fh, why, sizeof(why)), 0);
	ck_assert_uint_eq(fh.type, PS_MSG_HELLO_REPLY);
	ck_assert_uint_lt(fh.meta_len + fh.payload_len, sizeof(buf));
	size_t got = 0;
	while (got < fh.meta_len + fh.payload_len) {
		ssize_t k = read(fd, buf + got, fh.meta_len + fh.payload_len - got);
		ck_assert_int_gt(k, 0);
		got += (size_t)k;
	}
	Ps__HelloReply *r = ps__hello_reply__unpack(NULL, fh.meta_len, buf);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->ok, "%s", r->error);
	ps__hello_reply__free_unpacked(r, NULL);
	return fd;
}

/* A worker restarted while its old connection is still open but silent
 * (its host died: no FIN) takes over once the old one has missed its
 * heartbeats; while the old one still talks, the new one is refused. */
START_TEST(test_restart_takes_over_silent_connection)
{
	struct one o;
	struct ps_client *b = NULL;
	char err[512];

	start_one(&o, 1, "consistency:\n  mode: async\nsecurity:\n  auth: false\n"
		  "limits:\n  idle_timeout_ms: 1500\n");
	/* the shard listens once a worker can join */
	b = join_ok(&o.cfg, 0);
	ps_client_free(b);
	b = NULL;
	int fd = raw_worker(&o.cfg, o.port, 0);
	/* it just spoke: a second rank 0 is a duplicate */
	ck_assert_int_ne(join(&o.cfg, 0, &b, err, sizeof(err)), 0);
	ps_client_free(b);
	b = NULL;
	ck_assert_msg(strstr(err, "worker 0") && strstr(err, "already"), "%s", err);
	/* silent past two heartbeat periods (2/3 of the idle timeout): a
	 * restart takes over, well before the idle timeout closes it */
	double t0 = ps_now_s();
	int rc;
	while ((rc = ps_client_init(&b, &o.cfg, 0, err, sizeof(err))) != 0) {
		ck_assert_msg(ps_now_s() - t0 < 10 * tu_time_scale(), "never taken over: %s", err);
		tu_sleep_ms(100);
	}
	printf("measured: a restart took over a silent connection after %.2f s\n",
	       ps_now_s() - t0);
	ps_client_free(b);
	close(fd);
	stop_one(&o);
}
END_TEST

/* Sync, 2 workers: worker 1 leaves and is dropped; worker 0 pushes clock
 * k for tensor a only, so a's slices move to k + 1 and b's stay at k. A
 * new worker 1 joins: told clock k, its push for clock k of both tensors
 * is accepted (a's part came too late and is set aside), and the cluster
 * goes on. */
START_TEST(test_rejoin_at_told_clock)
{
	struct one o;
	static float g[1000], w[1000];
	struct ps_tensor ga = { .name = "a", .data = g, .count = 1000 };
	struct ps_tensor gab[2] = { { .name = "a", .data = g, .count = 1000 },
				    { .name = "b", .data = g, .count = 1000 } };
	struct ps_tensor wb = { .name = "b", .data = w, .count = 1000 };

	start_one(&o, 2, "consistency:\n  mode: sync\nlimits:\n  drop_timeout_ms: 200\n"
		  "log:\n  level: info\n");
	struct ps_client *w0 = join_ok(&o.cfg, 0), *w1 = join_ok(&o.cfg, 1);
	for (uint64_t k = 0; k < 3; k++) {
		int64_t p0 = ps_client_push(w0, k, gab, 2, PS_PUSH_END_CLOCK);
		int64_t p1 = ps_client_push(w1, k, gab, 2, PS_PUSH_END_CLOCK);
		ck_assert(p0 > 0 && p1 > 0);
		ck_assert_int_eq(ps_client_wait(w0, p0), 0);
		ck_assert_int_eq(ps_client_wait(w1, p1), 0);
	}
	ps_client_free(w1);
	/* worker 1 dropped: wait for the shard to say so */
	wait_dropped(&o, 1);
	int64_t p = ps_client_push(w0, 3, &ga, 1, 0);
	ck_assert_int_eq(ps_client_wait(w0, p), 0);
	/* a's slices are at 4 now, b's at 3 */
	w1 = join_ok(&o.cfg, 1);
	ck_assert_uint_eq(ps_client_clock(w1), 3);
	/* the shard kept running: no checkpoint to claim (ps-worker says so) */
	ck_assert_msg(!ps_client_from_checkpoint(w1), "clock 3 taken for a checkpoint");
	p = ps_client_push(w1, 3, gab, 2, PS_PUSH_END_CLOCK);
	ck_assert_msg(ps_client_wait(w1, p) == 0, "the rejoined worker's push at the clock it was "
		      "told: %s", ps_client_error(w1));
	p = ps_client_push(w0, 3, &gab[1], 1, PS_PUSH_END_CLOCK);
	ck_assert_int_eq(ps_client_wait(w0, p), 0);
	p = ps_client_pull(w1, 4, &wb, 1);
	ck_assert_msg(ps_client_wait(w1, p) == 0, "pull: %s", ps_client_error(w1));
	ps_client_free(w0);
	ps_client_free(w1);
	stop_one(&o);
}
END_TEST

/* The same with an embedding table: the table applied clock 3 with worker
 * 0 alone, and the rejoined worker's rows for clock 3 are set aside, not
 * refused (the dense parts as above). */
START_TEST(test_rejoin_rows_at_told_clock)
{
	struct one o;
	static float g[1000], w[1000], rg[2 * 4];
	static const uint64_t ids[2] = { 3, 11 };
	struct ps_tensor gab[2] = { { .name = "a", .data = g, .count = 1000 },
				    { .name = "b", .data = g, .count = 1000 } };
	struct ps_tensor ga = { .name = "a", .data = g, .count = 1000 };
	struct ps_tensor wb = { .name = "b", .data = w, .count = 1000 };
	float rows[2 * 4];

	for (int i = 0; i < 8; i++)
		rg[i] = 1.0f;
	start_one(&o, 2, "  embeddings:\n    - {name: e, dim: 4}\n"
		  "consistency:\n  mode: sync\nlimits:\n  drop_timeout_ms: 200\n"
		  "log:\n  level: info\n");
	struct ps_client *w0 = join_ok(&o.cfg, 0), *w1 = join_ok(&o.cfg, 1);
	for (uint64_t k = 0; k < 3; k++) {
		ck_assert_int_eq(ps_client_push_rows(w0, "e", k, ids, 2, rg, 0), 0);
		ck_assert_int_eq(ps_client_push_rows(w1, "e", k, ids, 2, rg, 0), 0);
		int64_t p0 = ps_client_push(w0, k, gab, 2, PS_PUSH_END_CLOCK);
		int64_t p1 = ps_client_push(w1, k, gab, 2, PS_PUSH_END_CLOCK);
		ck_assert(p0 > 0 && p1 > 0);
		ck_assert_int_eq(ps_client_wait(w0, p0), 0);
		ck_assert_int_eq(ps_client_wait(w1, p1), 0);
	}
	ps_client_free(w1);
	wait_dropped(&o, 1);
	/* worker 0 alone: table e and a's slices apply clock 3, b waits */
	ck_assert_int_eq(ps_client_push_rows(w0, "e", 3, ids, 2, rg, 0), 0);
	int64_t p = ps_client_push(w0, 3, &ga, 1, 0);
	ck_assert_int_eq(ps_client_wait(w0, p), 0);
	ck_assert_int_eq(ps_client_pull_rows(w0, "e", 4, ids, 2, rows), 0);
	w1 = join_ok(&o.cfg, 1);
	ck_assert_uint_eq(ps_client_clock(w1), 3);
	int rc = ps_client_push_rows(w1, "e", 3, ids, 2, rg, 0);
	ck_assert_msg(rc == 0, "the rejoined worker's rows at the clock it was told: %s",
		      ps_client_error(w1));
	p = ps_client_push(w1, 3, gab, 2, PS_PUSH_END_CLOCK);
	ck_assert_msg(ps_client_wait(w1, p) == 0, "dense push: %s", ps_client_error(w1));
	p = ps_client_push(w0, 3, &gab[1], 1, PS_PUSH_END_CLOCK);
	ck_assert_int_eq(ps_client_wait(w0, p), 0);
	p = ps_client_pull(w1, 4, &wb, 1);
	ck_assert_msg(ps_client_wait(w1, p) == 0, "pull: %s", ps_client_error(w1));
	/* the set-aside rows changed nothing: the table is where worker 0's
	 * clock 3 left it */
	float after[2 * 4];
	ck_assert_int_eq(ps_client_pull_rows(w1, "e", 4, ids, 2, after), 0);
	ck_assert_int_eq(memcmp(rows, after, sizeof(rows)), 0);
	ps_client_free(w0);
	ps_client_free(w1);
	stop_one(&o);
}
END_TEST

/* With the default limits, a killed worker (its connection closed) stops
 * a sync cluster for seconds: the survivor's next pull is answered well
 * within the old default's minute. */
START_TEST(test_dead_worker_default_drop)
{
	struct one o;
	static float g[1000], w[1000];
	struct ps_tensor gab[2] = { { .name = "a", .data = g, .count = 1000 },
				    { .name = "b", .data = g, .count = 1000 } };
	struct ps_tensor wa = { .name = "a", .data = w, .count = 1000 };

	start_one(&o, 2, "consistency:\n  mode: sync\n");
	struct ps_client *w0 = join_ok(&o.cfg, 0), *w1 = join_ok(&o.cfg, 1);
	ps_client_free(w1); /* as a killed process's: the connection closes */
	double t0 = ps_now_s();
	int64_t p = ps_client_push(w0, 0, gab, 2, PS_PUSH_END_CLOCK);
	ck_assert_int_eq(ps_client_wait(w0, p), 0);
	p = ps_client_pull(w0, 1, &wa, 1);
	int rc = ps_client_wait(w0, p);
	double took = ps_now_s() - t0;
	printf("measured: a sync pull waited %.1f s for a killed worker (default limits)\n", took);
	ck_assert_msg(rc == 0, "pull: %s", ps_client_error(w0));
	ck_assert_msg(took < 15 * tu_time_scale(), "the pull waited %.1f s for a dead worker",
		      took);
	ps_client_free(w0);
	stop_one(&o);
}
END_TEST

/* Wrong secrets: each failure is counted, the log names the peer's
 * address, and a flood of them writes a bounded number of lines. */
START_TEST(test_auth_failures_logged)
{
	struct one o;
	char wrong[64], err[512];
	struct ps_config wcfg;
	struct ps_shard_stats st;
	const int tries = 40;

	start_one(&o, 1, "");
	ps_client_free(join_ok(&o.cfg, 0)); /* the shard is up */
	struct ps_client *mon = NULL;
	ck_assert_msg(join(&o.cfg, -1, &mon, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(tu_write_secret(wrong), 0);
	wcfg = o.cfg;
	snprintf(wcfg.security.secret_file, sizeof(wcfg.security.secret_file), "%s", wrong);
	for (int i = 0; i < tries; i++) {
		struct ps_client *c = NULL;
		ck_assert_int_ne(ps_client_init(&c, &wcfg, 0, err, sizeof(err)), 0);
		ps_client_free(c);
	}
	/* the shard counts a failure when it reads the bad proof or the close
	 * of a client that gave up first, on other connections than the
	 * monitor's: wait (2 s at most) for the last one to be counted */
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(ps_client_stats(mon, 0, &st), 0);
		if (st.auth_failures >= (uint64_t)tries)
			break;
		tu_sleep_ms(10);
	}
	ck_assert_uint_eq(st.auth_failures, tries);
	ps_client_free(mon);
	ck_assert_int_eq(tu_stop_server(o.pid), 0);
	char *log = read_log(o.log);
	int lines = count_of(log, "authentication failed");
	printf("measured: %d failed authentications, %d log lines\n", tries, lines);
	ck_assert_msg(lines >= 1 && strstr(log, "127.0.0.1:"), "%s", log);
	ck_assert_msg(lines <= 10, "%d lines for %d failures: not rate-limited", lines, tries);
	ck_assert_msg(strstr(log, "not logged"), "the log says how many were left out: %s", log);
	free(log);
	unlink(wrong);
	unlink(o.path);
	unlink(o.log);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("agree");
	TCase *tc = tcase_create("agree");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_settings_must_agree);
	TU_ADD(tc, test_every_setting_compared);
	TU_ADD(tc, test_partner_settings_compared);
	TU_ADD(tc, test_duplicate_rank_refused);
	TU_ADD(tc, test_restart_takes_over_silent_connection);
	TU_ADD(tc, test_rejoin_at_told_clock);
	TU_ADD(tc, test_rejoin_rows_at_told_clock);
	TU_ADD(tc, test_dead_worker_default_drop);
	TU_ADD(tc, test_auth_failures_logged);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
