/* metrics_http.c - a shard's Prometheus /metrics, /healthz and /readyz
 * over libmicrohttpd (metrics_http.h).
 *
 * Held by nobody: one client address may hold PER_ADDR_CONNS of the
 * MAX_CONNS connections, and a connection whose request header is not in
 * HEADER_DEADLINE_S after it opened (or after its last reply) is cut, a
 * byte a second or not; /healthz and /readyz read the loop's liveness beat
 * and the readiness it notes with it, never the loop itself, so no flood
 * of them reaches the training loop. */
#include <stdatomic.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <math.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>
#include "codec.h"
#include "histo.h"
#include "members.h"
#include "metrics_http.h"
#include "replica.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "rows.h"
#include "server.h"
#include "server_int.h"

#define LOOP_WAIT_S 2           /* /metrics waits this for the loop; /healthz: beat age */
#define BEAT_MS 250             /* the loop's liveness beat (and deadline scan) */
#define MAX_CONNS 64
#define PER_ADDR_CONNS 8        /* connections one client address may hold */
#define HEADER_DEADLINE_S 5     /* for a request's header, from the connection or last reply */

/* One HTTP connection, for the header deadline (under conn_mu). */
struct http_conn {
	struct http_conn *prev, *next;
	int fd;
	double since;               /* opened, or its last reply ended */
	int in_request;             /* its header is in: being answered */
	int cut;                    /* shut down for the deadline */
};

struct ps_metrics_http {
	struct ps_server *s;
	struct MHD_Daemon *d;
	uv_timer_t beat_timer;      /* loop: the liveness beat, and the deadline scan */
	_Atomic uint64_t beat_us;   /* when the loop last ran the beat (ps_now_s, in us) */
	_Atomic int joining;        /* at the beat: replication has not settled who serves */
	pthread_mutex_t conn_mu;
	struct http_conn *conns;    /* open connections, under conn_mu */
	uint64_t cut_total;         /* connections cut for the deadline (loop thread) */
	int nclosed;                /* handles closed at stop (2: free) */
	uv_async_t async;           /* the HTTP thread asks the loop to render */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t asked, rendered;   /* request generations, under mu */
	char *page;                 /* the latest rendering, under mu */
	size_t page_len;
	int closing;
	int token_on;               /* stats.token_file: /metrics wants the bearer token */
	uint8_t token_hash[32];     /* BLAKE2b of the token (compared in constant time) */
};

static const char *const codec_label[PS_CODEC_COUNT] = { "none", "fp16", "q8", "topk", "sign" };

static void counter(FILE *f, const char *name, const char *help, uint64_t v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name, v);
}

static void counter_f(FILE *f, const char *name, const char *help, double v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %.17g\n", name, help, name, name, v);
}

static void gauge(FILE *f, const char *name, const char *help, double v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void histogram(FILE *f, const char *name, const char *help, const struct ps_histo *h)
{
	uint64_t cum = 0;

	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (int i = 0; i < PS_HISTO_BUCKETS; i++) {
		cum += h->count[i];
		if (i < PS_HISTO_BUCKETS - 1)
			fprintf(f, "%s_bucket{le=\"%.9g\"} %" PRIu64 "\n", name, ps_histo_bound_s(i),
				cum);
		else
			fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	}
	fprintf(f, "%s_sum %.17g\n%s_count %" PRIu64 "\n", name, h->sum_s, name, cum);
}

/* Embedding tables: one sample per table of each family. */
static void render_tables(const struct ps_server *s, FILE *f)
{
	static const struct {
		const char *name, *type, *help;
	} fam[] = {
		{ "ps_table_rows", "gauge", "Live rows of the embedding table on this shard." },
		{ "ps_table_bytes", "gauge", "Bytes the table holds (index, rows, metadata, filter)." },
		{ "ps_table_bytes_per_row", "gauge", "Bytes held per live row." },
		{ "ps_table_admitted_total", "counter", "Rows created (admitted)." },
		{ "ps_table_evicted_total", "counter", "Rows dropped for max_rows." },
		{ "ps_table_expired_total", "counter", "Rows dropped by the ttl." },
		{ "ps_table_filter_ids", "gauge", "Ids counted in the admission filter." },
		{ "ps_table_filter_bytes", "gauge", "Bytes of the admission filter." },
		{ "ps_table_filter_hit_ratio", "gauge",
		  "Pushes of ids without a row whose id was already counted, over all of them." },
		{ "ps_table_pulled_rows_total", "counter", "Rows read by pulls." },
		{ "ps_table_pushed_rows_total", "counter", "Row gradients applied." },
	};

	for (size_t k = 0; s->rows && s->rows->ntables && k < sizeof(fam) / sizeof(fam[0]); k++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fam[k].name, fam[k].help, fam[k].name,
			fam[k].type);
		for (int t = 0; t < s->rows->ntables; t++) {
			const struct ps_table *tb = &s->rows->t[t].tb;
			double bytes = (double)ps_table_bytes(tb);
			double v[] = { (double)tb->nrows, bytes, tb->nrows ? bytes / tb->nrows : 0,
				       (double)tb->c.admitted, (double)tb->c.evicted,
				       (double)tb->c.expired, (double)tb->admit.used,
				       (double)ps_admit_bytes(&tb->admit),
				       tb->admit.lookups ? (double)tb->admit.hits / tb->admit.lookups : 0,
				       (double)tb->c.pulled, (double)tb->c.pushed };
			/* table names are [A-Za-z0-9_.:/-]: nothing to escape in a label */
			fprintf(f, "%s{table=\"%s\"} %.17g\n", fam[k].name, tb->tc->name, v[k]);
		}
	}
}

void ps_metrics_render(const struct ps_server *s, FILE *f)
{
	const struct ps_server_counters *c = &s->c;
	uint64_t lo = UINT64_MAX, hi = 0;
	int nw = s->cfg->nworkers;

	fprintf(f, "# HELP ps_shard_info The shard this endpoint belongs to and how it runs.\n"
		   "# TYPE ps_shard_info gauge\n"
		   "ps_shard_info{shard=\"%d\",consistency=\"%s\",optimizer=\"%s\"} 1\n",
		s->shard, s->cfg->consistency == PS_SYNC ? "sync" : "async",
		ps_optim_name(s->cfg->optim.kind));
	gauge(f, "ps_uptime_seconds", "Seconds since the shard started.",
	      ps_now_s() - s->started);
	counter(f, "ps_push_requests_total", "Push requests received.", c->pushes);
	counter(f, "ps_pull_requests_total", "Pull requests received.", c->pulls);
	counter(f, "ps_received_bytes_total", "Payload bytes of pushes received.", c->bytes_in);
	counter(f, "ps_sent_bytes_total", "Payload bytes of pull replies sent.", c->bytes_out);
	fprintf(f, "# HELP ps_push_raw_bytes_total Pushed gradient bytes as float32, by codec.\n"
		   "# TYPE ps_push_raw_bytes_total counter\n");
	for (int k = 0; k < PS_CODEC_COUNT; k++)
		fprintf(f, "ps_push_raw_bytes_total{codec=\"%s\"} %" PRIu64 "\n", codec_label[k],
			c->push_raw[k]);
	fprintf(f, "# HELP ps_push_wire_bytes_total Pushed gradient bytes as received, by codec.\n"
		   "# TYPE ps_push_wire_bytes_total counter\n");
	for (int k = 0; k < PS_CODEC_COUNT; k++)
		fprintf(f, "ps_push_wire_bytes_total{codec=\"%s\"} %" PRIu64 "\n", codec_label[k],
			c->push_wire[k]);
	counter(f, "ps_pull_raw_bytes_total", "Weights served, as float32 bytes.", c->pull_raw);
	counter(f, "ps_pull_wire_bytes_total", "Weights served, as sent.", c->pull_wire);
	counter(f, "ps_optimizer_steps_total", "Optimizer applications to a slice.",
		s->store.applies);
	counter_f(f, "ps_optimizer_seconds_total", "Seconds spent in the optimizer.",
	      s->store.apply_seconds);
	counter(f, "ps_optimizer_bytes_total", "Gradient bytes the optimizer consumed.",
		s->store.bytes_applied);
	counter(f, "ps_request_errors_total", "Requests answered with an error.", c->errors);
	counter(f, "ps_rejected_frames_total", "Frames refused (bad header, size, protocol).",
		c->rejected_frames);
	counter(f, "ps_auth_failures_total",
		"Handshakes refused for a wrong proof and frames failing their MAC.",
		c->auth_failures);
	counter(f, "ps_duplicate_pushes_total",
		"Pushes resent after a reconnect and answered without applying them again.",
		c->duplicate_pushes);
	counter(f, "ps_reader_refused_total",
		"Requests of readers that would have changed state (push, declare, checkpoint), "
		"refused.", c->reader_refused);
	gauge(f, "ps_connections", "Open connections.", s->nconns);
	if (s->ckpt_path[0]) {
		/* an alert on the age catches checkpoints that stopped (a full
		 * disk): training goes on, and what came after is lost at a crash */
		gauge(f, "ps_checkpoint_age_seconds", "Seconds since the last checkpoint written "
		      "(or loaded at the start; since the start when none was).",
		      ps_now_s() - (s->ckpt_last_ok ? s->ckpt_last_ok : s->started));
		counter(f, "ps_checkpoint_failures_total", "Checkpoints that failed since the start.",
			s->ckpt_failures);
		gauge(f, "ps_checkpoint_every_seconds", "checkpoint.every_s (0: periodic ones off).",
		      s->cfg->checkpoint.every_s);
	}
	if (s->transport->ops->queue_stats) {
		struct ps_queue_stats q;
		s->transport->ops->queue_stats(s->transport, &q);
		gauge(f, "ps_reply_queue_bytes", "Reply bytes queued to every peer together.",
		      (double)q.bytes);
		gauge(f, "ps_reply_queue_peak_bytes", "The most reply bytes one peer had queued.",
		      (double)q.peak_conn);
		gauge(f, "ps_reply_queue_total_peak_bytes",
		      "The most reply bytes every peer together had queued.", (double)q.peak_total);
		gauge(f, "ps_paused_connections",
		      "Connections not read while their replies wait (backpressure).", q.paused);
	}
	fprintf(f, "# HELP ps_worker_clock Clocks each worker has finished on this shard.\n"
		   "# TYPE ps_worker_clock gauge\n");
	for (int r = 0; r < nw; r++) {
		fprintf(f, "ps_worker_clock{worker=\"%d\"} %" PRIu64 "\n", r, s->finished[r]);
		lo = s->finished[r] < lo ? s->finished[r] : lo;
		hi = s->finished[r] > hi ? s->finished[r] : hi;
	}
	fprintf(f, "# HELP ps_worker_connected 1 while the worker has a connection to this shard.\n"
		   "# TYPE ps_worker_connected gauge\n");
	for (int r = 0; r < nw; r++)
		fprintf(f, "ps_worker_connected{worker=\"%d\"} %d\n", r, s->connected[r] > 0);
	{
		uint64_t joins, leaves;

		ps__members_counts(s, &joins, &leaves);
		counter(f, "ps_member_joins_total", "Workers that joined the running cluster.",
			joins);
		counter(f, "ps_member_leaves_total", "Workers that left on purpose (not dropped).",
			leaves);
		gauge(f, "ps_member_epoch", "Membership changes in effect at the shard's clock.",
		      (double)ps__members_epoch(s, ps__srv_resume_clock(s)));
	}
	/* re-sharding (docs/elastic.md, "Operations") */
	gauge(f, "ps_map_epoch", "Re-shards this shard's state went through (kept in its "
	      "checkpoint).", (double)s->map_epoch);
	counter(f, "ps_reshards_total", "Re-shards this shard came out of (its map epoch).",
		s->map_epoch);
	counter(f, "ps_reshard_bytes_in_total", "Bytes (weights, optimizer state, rows) this "
		"process took in from other shard indices' checkpoints at its --reshard-from start.",
		s->reshard_in_bytes);
	counter(f, "ps_reshard_slices_in_total", "Dense slices this process took in from other "
		"shard indices' checkpoints at its --reshard-from start.", s->reshard_in_slices);
	counter(f, "ps_reshard_rows_in_total", "Embedding rows this process took in from other "
		"shard indices' checkpoints at its --reshard-from start.", s->reshard_in_rows);
	gauge(f, "ps_reshard_stop_clock", "The clock a live re-shard's stop holds this shard at "
	      "(pushes from it on refused); 0 when none.", (double)s->stop_at);
	gauge(f, "ps_reshard_stop_committed", "1 once that stop is committed (the shard "
	      "checkpoints and exits at that clock).", s->stop_committed);
	gauge(f, "ps_clock_staleness", "Fastest minus slowest worker clock.",
	      nw ? (double)(hi - lo) : 0.0);
	gauge(f, "ps_max_clock_gap", "Largest clock gap a pull was answered with.",
	      (double)c->max_clock_gap);
	if (s->repl) {
		Ps__Stats st = PS__STATS__INIT;
		char partner[320];

		ps__repl_stats(s, &st, partner, sizeof(partner));
		fprintf(f, "# HELP ps_replica_info This process's place in its shard's pair "
			   "(cluster.replicas: 1).\n# TYPE ps_replica_info gauge\n"
			   "ps_replica_info{replica=\"%d\",role=\"%s\",partner=\"%s\"} 1\n",
			st.repl_replica, ps__repl_state_name((int)st.repl_state), partner);
		gauge(f, "ps_replica_primary", "1 while this process serves the shard's workers.",
		      st.repl_state == PS_REPL_PRIMARY);
		gauge(f, "ps_replica_partner_up", "1 while the partner is connected and has the "
		      "state (a primary with 0 goes on alone, without a copy).", st.repl_partner_up);
		gauge(f, "ps_replica_epoch", "Takeovers of the shard so far, as this process knows.",
		      (double)st.repl_epoch);
		gauge(f, "ps_replica_lag_batches", "Batches sent to the backup and not confirmed.",
		      (double)st.repl_lag);
		counter(f, "ps_replica_failovers_total", "Takeovers made by this process.",
			st.repl_failovers);
		counter(f, "ps_replica_batches_total", "Primary: batches sent to its backup; "
			"backup: batches applied (heartbeats apart).", st.repl_batches);
		counter(f, "ps_replica_bytes_total", "Payload bytes of those batches (gradients, row "
			"records, declared values).", st.repl_bytes);
		counter(f, "ps_replica_heartbeats_total", "Primary: heartbeats sent; backup: "
			"heartbeats received.", st.repl_heartbeats);
	}
	histogram(f, "ps_push_latency_seconds", "Push from its decoding to its ack.", &c->push_lat);
	histogram(f, "ps_pull_latency_seconds",
		  "Pull from its arrival to its reply (consistency wait included).", &c->pull_lat);
	render_tables(s, f);
}

/* Loop thread: renders the page for every request asked so far. */
static void on_render(uv_async_t *a)
{
	struct ps_metrics_http *h = a->data;
	char *buf = NULL;
	size_t len = 0;
	uint64_t target;
	FILE *f;

	pthread_mutex_lock(&h->mu);
	target = h->asked;
	pthread_mutex_unlock(&h->mu);
	f = open_memstream(&buf, &len);
	if (f) {
		ps_metrics_render(h->s, f);
		/* (a NULL buf after a good fclose: its last realloc failed) */
		if (fclose(f) || !buf) {
			free(buf);
			buf = NULL;
		}
	}
	pthread_mutex_lock(&h->mu);
	if (buf) {
		free(h->page);
		h->page = buf;
		h->page_len = len;
	}
	h->rendered = target;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
			     char *body, size_t len)
{
	struct MHD_Response *r;
	enum MHD_Result rc;

	r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	rc = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status, const char *s)
{
	char *b = strdup(s);

	return b ? reply(conn, status, "text/plain; charset=utf-8", b, strlen(b)) : MHD_NO;
}

/* HTTP thread: asks the loop for a fresh page and waits for it. */
static char *fetch_page(struct ps_metrics_http *h, size_t *len)
{
	struct timespec until;
	char *copy = NULL;
	uint64_t mine;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += LOOP_WAIT_S;
	pthread_mutex_lock(&h->mu);
	mine = ++h->asked;
	uv_async_send(&h->async);
	while (!h->closing && h->rendered < mine)
		if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT)
			break;
	if (!h->closing && h->rendered >= mine && h->page) {
		copy = malloc(h->page_len ? h->page_len : 1);
		if (copy) {
			memcpy(copy, h->page, h->page_len);
			*len = h->page_len;
		}
	}
	pthread_mutex_unlock(&h->mu);
	return copy;
}

static uint64_t now_us(void)
{
	return (uint64_t)(ps_now_s() * 1e6);
}

/* Loop thread, every BEAT_MS: the loop is alive; connections past their
 * header deadline are shut down (libmicrohttpd then closes them: the fd
 * stays theirs until MHD_CONNECTION_NOTIFY_CLOSED, which takes conn_mu). */
static void on_beat(uv_timer_t *t)
{
	struct ps_metrics_http *h = t->data;
	double now = ps_now_s();
	int cut = 0;

	atomic_store(&h->joining, h->s->repl && h->s->repl->state == PS_REPL_JOINING);
	atomic_store(&h->beat_us, now_us());
	pthread_mutex_lock(&h->conn_mu);
	for (struct http_conn *c = h->conns; c; c = c->next)
		if (!c->in_request && !c->cut && now - c->since > HEADER_DEADLINE_S) {
			shutdown(c->fd, SHUT_RDWR);
			c->cut = 1;
			cut++;
		}
	pthread_mutex_unlock(&h->conn_mu);
	if (cut && !h->cut_total)
		ps_warn("stats.http: %d connection(s) sent no whole request within %d s: cut (so "
			"is every such one from now on)", cut, HEADER_DEADLINE_S);
	h->cut_total += (uint64_t)cut;
}

/* HTTP thread: a connection opened or closed. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct ps_metrics_http *h = cls;
	struct http_conn *c = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		c = calloc(1, sizeof(*c));
		if (!c || !ci) { /* no deadline for it; the idle timeout still holds */
			free(c);
			*socket_context = NULL;
			return;
		}
		c->fd = ci->connect_fd;
		c->since = ps_now_s();
		pthread_mutex_lock(&h->conn_mu);
		c->next = h->conns;
		if (h->conns)
			h->conns->prev = c;
		h->conns = c;
		pthread_mutex_unlock(&h->conn_mu);
		*socket_context = c;
	} else if (c) {
		pthread_mutex_lock(&h->conn_mu);
		if (c->prev)
			c->prev->next = c->next;
		else
			h->conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
		pthread_mutex_unlock(&h->conn_mu);
		free(c);
		*socket_context = NULL;
	}
}

/* HTTP thread: the connection's request is in (in 1) or answered (0). */
static void conn_request(struct ps_metrics_http *h, struct MHD_Connection *conn, int in)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *c = ci ? ci->socket_context : NULL;

	if (!c)
		return;
	pthread_mutex_lock(&h->conn_mu);
	c->in_request = in;
	c->since = ps_now_s();
	pthread_mutex_unlock(&h->conn_mu);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)con_cls;
	(void)toe;
	conn_request(cls, conn, 0);
}

/* Whether the request carries the bearer token: its hash against the
 * token's, so neither the comparison nor its length shows in the timing. */
static int token_ok(const struct ps_metrics_http *h, struct MHD_Connection *conn)
{
	const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
	uint8_t got[32];
	int ok;

	if (!h->token_on)
		return 1;
	if (!a || strncasecmp(a, "Bearer ", 7))
		return 0;
	a += 7;
	crypto_generichash(got, sizeof(got), (const uint8_t *)a, strlen(a), NULL, 0);
	ok = sodium_memcmp(got, h->token_hash, sizeof(got)) == 0;
	sodium_memzero(got, sizeof(got));
	return ok;
}

/* Reads stats.token_file: owner-only, one line of 16..512 bytes. */
static int load_token(struct ps_metrics_http *h, const char *path)
{
	char buf[514];
	struct stat st;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not hang the start */

	if (fd < 0) {
		ps_error("stats.token_file %s: %s", path, strerror(errno));
		return -errno;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		ps_error("stats.token_file %s: must be a regular file of mode 0600 or stricter "
			 "(chmod 600 %s)", path, path);
		close(fd);
		return -EPERM;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
		n--;
	if (n < 16 || n > 512) {
		ps_error("stats.token_file %s: the token must be 16 to 512 bytes on one line (openssl "
			 "rand -hex 32 > %s makes one)", path, path);
		sodium_memzero(buf, sizeof(buf));
		return -EINVAL;
	}
	crypto_generichash(h->token_hash, sizeof(h->token_hash), (const uint8_t *)buf, (size_t)n,
			   NULL, 0);
	sodium_memzero(buf, sizeof(buf));
	h->token_on = 1;
	return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_size, void **con_cls)
{
	struct ps_metrics_http *h = cls;
	size_t len = 0;
	char *page;

	(void)version;
	(void)upload_data;
	(void)con_cls;
	conn_request(h, conn, 1);
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
	if (*upload_size)
		return reply_text(conn, MHD_HTTP_BAD_REQUEST, "no body expected\n");
	if (strcmp(url, "/metrics") && strcmp(url, "/healthz") && strcmp(url, "/readyz"))
		return reply_text(conn, MHD_HTTP_NOT_FOUND,
				  "not found: try /metrics, /healthz or /readyz\n");
	if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz")) {
		/* the loop's beat, not the loop: nothing here costs the shard.
		 * Both exist only once the state is loaded and the shard
		 * listens (ps_server_init_from starts this server after both);
		 * /readyz also wants replication to have settled who serves. */
		double age = (double)(now_us() - atomic_load(&h->beat_us)) * 1e-6;
		char msg[440];
		if (age > LOOP_WAIT_S) {
			snprintf(msg, sizeof(msg), "the shard's loop has not run for %.1f s\n", age);
			return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
		}
		if (url[1] == 'r' && atomic_load(&h->joining)) {
			snprintf(msg, sizeof(msg), "joining: not yet agreed with its partner %s which "
				 "of the two serves\n", h->s->repl->partner);
			return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
		}
		return reply_text(conn, MHD_HTTP_OK, url[1] == 'r' ? "ready\n" : "ok\n");
	}
	if (!token_ok(h, conn)) {
		struct MHD_Response *r;
		enum MHD_Result rc;
		char *b = strdup("401 unauthorized: /metrics needs the bearer token of "
				 "stats.token_file (Authorization: Bearer ...)\n");
		if (!b)
			return MHD_NO;
		r = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
		if (!r) {
			free(b);
			return MHD_NO;
		}
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"ps-server\"");
		MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
		rc = MHD_queue_response(conn, MHD_HTTP_UNAUTHORIZED, r);
		MHD_destroy_response(r);
		return rc;
	}
	page = fetch_page(h, &len);
	if (!page)
		return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
				  "the shard's loop did not answer within 2 s\n");
	return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", page, len);
}

/* Both handles closed: h goes. */
static void on_handle_closed(uv_handle_t *a)
{
	struct ps_metrics_http *h = a->data;

	if (++h->nclosed < 2)
		return;
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	pthread_mutex_destroy(&h->conn_mu);
	free(h->page);
	free(h);
}

static void close_handles(struct ps_metrics_http *h)
{
	uv_timer_stop(&h->beat_timer);
	uv_close((uv_handle_t *)&h->beat_timer, on_handle_closed);
	uv_close((uv_handle_t *)&h->async, on_handle_closed);
}

int ps_metrics_http_start(struct ps_server *s, const char *host, int port,
			  struct ps_metrics_http **out)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	struct ps_metrics_http *h;
	pthread_condattr_t ca;
	char ports[16];
	int rc;

	snprintf(ports, sizeof(ports), "%d", port);
	rc = getaddrinfo(host, ports, &hints, &ai);
	if (rc) {
		ps_error("stats.http: cannot resolve '%s': %s", host, gai_strerror(rc));
		return -EINVAL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		freeaddrinfo(ai);
		return -ENOMEM;
	}
	h->s = s;
	if (s->cfg->stats.token_file[0] && (rc = load_token(h, s->cfg->stats.token_file))) {
		freeaddrinfo(ai);
		free(h);
		return rc;
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->conn_mu, NULL);
	atomic_init(&h->joining, s->repl && s->repl->state == PS_REPL_JOINING);
	atomic_init(&h->beat_us, now_us());
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cv, &ca);
	pthread_condattr_destroy(&ca);
	uv_async_init(s->loop, &h->async, on_render);
	h->async.data = h;
	uv_timer_init(s->loop, &h->beat_timer);
	h->beat_timer.data = h;
	uv_timer_start(&h->beat_timer, on_beat, BEAT_MS, BEAT_MS);
	uv_unref((uv_handle_t *)&h->beat_timer);
	h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
					(ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				(uint16_t)port, NULL, NULL, on_request, h,
				MHD_OPTION_SOCK_ADDR, ai->ai_addr,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNS,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_ADDR_CONNS,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HEADER_DEADLINE_S,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
				MHD_OPTION_END);
	freeaddrinfo(ai);
	if (!h->d) {
		ps_error("stats.http: cannot serve metrics on %s:%d (address in use or not local?)",
			 host, port);
		close_handles(h);
		return -EADDRINUSE;
	}
	ps_info("shard %d: Prometheus metrics on http://%s:%d/metrics%s", s->shard, host, port,
		h->token_on ? " (bearer token of stats.token_file required)" : "");
	*out = h;
	return 0;
}

void ps_metrics_http_stop(struct ps_metrics_http *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->closing = 1;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	MHD_stop_daemon(h->d); /* joins the HTTP thread */
	close_handles(h);
}
