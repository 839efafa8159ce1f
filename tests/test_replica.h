/* test_replica.h - what the tests of replicated shards share (it_replica,
 * it_replica_rows, it_replica_cases, it_replica_decl, it_replica_stats,
 * it_elastic_repl): a pair's config written and loaded, one process of a
 * pair or both started, one process of a pair asked for its stats, the
 * pair's roles (waited for), and a plain HTTP GET of a shard's metrics
 * server.
 */
#ifndef TEST_REPLICA_H
#define TEST_REPLICA_H

#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_time.h"
#include "test_util.h"

/* The config yaml in a fresh temporary file (its name into cfg_path, 64
 * bytes), loaded into cfg, and a fresh folder for the processes' logs made
 * from the mkdtemp template logtmpl (into logdir, 64 bytes). */
static inline void tu_replica_config(const char *yaml, char *cfg_path, struct ps_config *cfg,
				     char *logdir, const char *logtmpl)
{
	char err[512];

	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	strcpy(logdir, logtmpl);
	ck_assert_ptr_nonnull(mkdtemp(logdir));
}

/* Process replica (0 primary's place in cluster.servers, 1 cluster.backups)
 * of shard `shard`, its stderr appended to LOGDIR/shardK-rR.log; with
 * die_with_parent it is killed when the process that started it ends (a
 * case that fails takes its shards with it). */
static inline pid_t tu_start_replica(const char *cfg_path, const char *logdir, int shard,
				     int replica, int die_with_parent)
{
	char s[16], r[16], log[128];
	pid_t pid;

	snprintf(s, sizeof(s), "%d", shard);
	snprintf(r, sizeof(r), "%d", replica);
	snprintf(log, sizeof(log), "%s/shard%d-r%d.log", logdir, shard, replica);
	pid = tu_fork();
	if (pid == 0) {
		if (die_with_parent)
			prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execl("bin/ps-server", "ps-server", "--config", cfg_path, "--shard", s, "--replica",
		      r, "--log-level", getenv("PS_TEST_LOG") ? getenv("PS_TEST_LOG") : "info",
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Both processes of shard k's pair (srv[r]: replica r), killed when the
 * process that started them ends. */
static inline void tu_start_pair(const char *cfg_path, const char *logdir, int k, pid_t srv[2])
{
	srv[0] = tu_start_replica(cfg_path, logdir, k, 0, 1);
	srv[1] = tu_start_replica(cfg_path, logdir, k, 1, 1);
}

/* Shard k's counters from process r of its pair, as a monitor with short
 * timeouts; ckpt >= 0: a checkpoint request instead (1: written now, with
 * time for the write), whose answer carries the same counters. */
static inline int tu_replica_stats(const struct ps_config *cfg, int k, int r, int ckpt,
				   struct ps_shard_stats *out)
{
	struct ps_config *c = malloc(sizeof(*c));
	struct ps_client *cl = NULL;
	char err[512];
	int rc;

	if (!c)
		return -1;
	memcpy(c, cfg, sizeof(*c));
	if (r)
		memcpy(c->shards, c->backups, sizeof(c->shards));
	c->limits.connect_timeout_ms = 500;
	c->limits.request_timeout_ms = ckpt == 1 ? 20000 : 1000;
	rc = ps_client_init(&cl, c, -1, err, sizeof(err));
	if (!rc) {
		rc = ckpt < 0 ? ps_client_stats(cl, k, out) : ps_client_checkpoint(cl, k, ckpt, out);
		ps_client_free(cl);
	}
	free(c);
	return rc;
}

/* Which process of shard k's pair is the primary (serving, state 3), or -1. */
static inline int tu_replica_primary(const struct ps_config *cfg, int k)
{
	for (int r = 0; r < 2; r++) {
		struct ps_shard_stats st;
		if (tu_replica_stats(cfg, k, r, -1, &st) == 0 && st.repl_state == 3)
			return r;
	}
	return -1;
}

/* Until one process of shard k's pair is the primary, seeing its partner,
 * with the other its backup holding the state: which one, or -1 after
 * limit_s (scaled). */
static inline int tu_wait_pair(const struct ps_config *cfg, int k, double limit_s)
{
	double t0 = ps_now_s();

	while (ps_now_s() - t0 < limit_s * tu_time_scale()) {
		struct ps_shard_stats a, b;
		if (tu_replica_stats(cfg, k, 0, -1, &a) == 0 &&
		    tu_replica_stats(cfg, k, 1, -1, &b) == 0) {
			if (a.repl_state == 3 && a.repl_partner_up && b.repl_state == 2)
				return 0;
			if (b.repl_state == 3 && b.repl_partner_up && a.repl_state == 2)
				return 1;
		}
		tu_sleep_ms(50);
	}
	return -1;
}

/* Seconds until every one of nshards pairs has a primary that sees its
 * partner up and a backup (state 2), or -1 after limit_s (scaled). */
static inline double tu_replicas_healthy(const struct ps_config *cfg, int nshards, double limit_s)
{
	double t0 = ps_now_s();

	limit_s *= tu_time_scale();
	while (ps_now_s() - t0 < limit_s) {
		int ok = 0;
		for (int k = 0; k < nshards; k++) {
			struct ps_shard_stats a, b;
			if (tu_replica_stats(cfg, k, 0, -1, &a) || tu_replica_stats(cfg, k, 1, -1, &b))
				break;
			ok += (a.repl_state == 3 && a.repl_partner_up && b.repl_state == 2) ||
			      (b.repl_state == 3 && b.repl_partner_up && a.repl_state == 2);
		}
		if (ok == nshards)
			return ps_now_s() - t0;
		tu_sleep_ms(50);
	}
	return -1;
}

/* GET path from 127.0.0.1:port into body (NUL-ended); the HTTP status, or
 * -1 when nothing answered. */
static inline int tu_http_get(int port, const char *path, char *body, size_t n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	char req[256];
	size_t len = 0;
	ssize_t r;
	int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1;

	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
	if (write(fd, req, strlen(req)) == (ssize_t)strlen(req))
		while (len + 1 < n && (r = read(fd, body + len, n - 1 - len)) > 0)
			len += (size_t)r;
	body[len] = 0;
	close(fd);
	if (sscanf(body, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	return status;
}

/* A free port below the ephemeral range, other than other and other + 1
 * (a restarted process must not find its port taken as the source port of
 * its partner's dial), and none of the last 64 it returned: a config's
 * list of ports is written before any process listens on them, and the
 * chain of seeds other = the port before can come back to one of them
 * ("duplicate server address"). */
static inline int tu_low_free_port(int other)
{
	static int recent[64], nrecent;
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)other;

	for (int i = 0; i < 1000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000), dup = 0;
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

		for (int j = 0; j < nrecent && j < 64; j++)
			dup |= recent[j] == p;
		if (dup || p == other || p == other + 1)
			continue;
		int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
		ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (fd >= 0)
			close(fd);
		if (ok) {
			recent[nrecent++ % 64] = p;
			return p;
		}
	}
	return tu_free_port();
}

/* Whether port is free on the loopback now. */
static inline int tu_port_free(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* A free port p below the ephemeral range with p + 1 free too (stats.http
 * of a pair: replica r serves on p + r), in 32000..32767 (tu_low_free_port
 * draws below 32000, so the two never meet). */
static inline int tu_low_free_pair(void)
{
	unsigned seed = (unsigned)getpid() * 40503u + (unsigned)(ps_now_s() * 1e6);

	for (int i = 0; i < 1000; i++) {
		int p = 32000 + (int)(rand_r(&seed) % 760);
		if (tu_port_free(p) && tu_port_free(p + 1))
			return p;
	}
	return tu_free_port();
}

/* qsort's order of doubles, ascending (failover times for a median). */
static inline int tu_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#endif
