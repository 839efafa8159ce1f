/* it_fake_shard.c - the client library (ps_client) against shards that lie.
 *
 * it_hostile attacks a real shard; this suite turns it round: the worker is
 * real and the shard is a test double speaking raw frames on the shard's
 * port, either without the secret (whoever binds the port after a crash)
 * or with it (an authenticated shard sending malformed replies). What must
 * hold (docs/security.md):
 *   - replies that come before the handshake completed (and, with
 *     security.auth, before the shard proved the secret) are never acted
 *     on: the connection is closed, the pull and the push stay pending,
 *     and both complete with exact values once the real shard is back;
 *   - a pull reply naming a slice the answering shard does not hold, or
 *     one that does not add up (codec, length, offsets, an fp16 copy that
 *     does not decode), fails the pull and writes nothing of that reply
 *     into the caller's weights;
 *   - every refusal of the handshake (a nonce one byte short or long, a
 *     second challenge, one to a process with security.auth off, a wrong
 *     proof, an ok without a challenge, a refusal before and after the
 *     secret was proven, a reply or undecodable metadata before the
 *     handshake) fails the first connection with its code and its whole
 *     text, and a nonce of exactly 32 bytes is taken;
 *   - the client's limits and paces, measured where its frames arrive:
 *     heartbeats a third of limits.idle_timeout_ms apart, a connection
 *     kept while the shard answers and closed no sooner than the limit
 *     once it is silent; a shard back within limits.reconnect_timeout_ms
 *     reconnected, one that is not given up with the whole reason, the
 *     attempts backing off; a join refused during a re-shard's stop asked
 *     again every 0.2 s, and given up after the reconnect limit.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include "auth.h"
#include "codec.h"
#include "config.h"
#include "frame_mac.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "shardmap.h"
#include "wire.h"
#include "test_util.h"

#define N 2048 /* floats of tensor a: two 4 KiB slices */

static double now_ms(void)
{
	return ps_now_s() * 1e3;
}

/* ---- a raw shard-side peer ---- */

struct fake {
	int fd;
	int keyed;                /* frames carry MACs (after the handshake) */
	struct ps_frame_keys keys; /* the shard's side: send = shard to client */
	uint64_t sseq, rseq;
};

static int fake_listen(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %d: %s", port,
		      strerror(errno));
	ck_assert_int_eq(listen(fd, 8), 0);
	return fd;
}

/* The next connection on lfd within ms (times tu_time_scale); -1 if none. */
static int fake_accept(int lfd, int ms)
{
	struct pollfd p = { lfd, POLLIN, 0 };

	if (poll(&p, 1, (int)(ms * tu_time_scale())) != 1)
		return -1;
	return accept(lfd, NULL, NULL);
}

/* Reads n bytes before the deadline: 0, or -1 on timeout or close. */
static int fake_read_n(int fd, void *b, size_t n, double deadline)
{
	uint8_t *p = b;

	while (n) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		int left = (int)(deadline - now_ms());
		if (left <= 0 || poll(&pfd, 1, left) != 1)
			return -1;
		ssize_t k = read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Reads one frame (its MAC checked once keyed); returns its type and the
 * unpacked metadata in *m (the raw metadata in meta, when not NULL, up to
 * *mlen bytes), or -1 on timeout or close. */
static int fake_recv(struct fake *fk, ProtobufCMessage **m, uint8_t *meta, size_t *mlen, int ms)
{
	double deadline = now_ms() + ms * tu_time_scale();
	uint8_t h[PS_WIRE_HDR_LEN], *body;
	struct ps_wire_limits lim = { .max_frame = 16 << 20, .max_meta = 1 << 20 };
	struct ps_frame f = { 0 };
	char why[200];

	if (fake_read_n(fk->fd, h, sizeof(h), deadline))
		return -1;
	ck_assert_int_eq(ps_wire_decode_hdr(h, &lim, &f.hdr, why, sizeof(why)), 0);
	size_t blen = f.hdr.meta_len + f.hdr.payload_len;
	body = malloc(blen + PS_MAC_TAG_LEN);
	ck_assert_int_eq(fake_read_n(fk->fd, body, blen, deadline), 0);
	if (fk->keyed) {
		struct ps_mac mac;
		ck_assert(f.hdr.flags & PS_FRAME_F_MAC);
		ck_assert_int_eq(fake_read_n(fk->fd, body + blen, PS_MAC_TAG_LEN, deadline), 0);
		ck_assert_int_eq(ps_mac_init(&mac), 0);
		ps_mac_begin(&mac, fk->keys.recv, fk->rseq++);
		ps_mac_update(&mac, h, sizeof(h));
		ps_mac_update(&mac, body, blen);
		ck_assert_msg(ps_mac_verify(&mac, body + blen) == 0, "the client's %s fails its MAC",
			      ps_wire_type_name(f.hdr.type));
		ps_mac_free(&mac);
	}
	if (meta) {
		ck_assert_uint_le(f.hdr.meta_len, *mlen);
		memcpy(meta, body, f.hdr.meta_len);
		*mlen = f.hdr.meta_len;
	}
	f.meta = body;
	*m = ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_msg(*m != NULL, "%s", why);
	free(body);
	return f.hdr.type;
}

/* A frame's bytes (malloc'ed, *len of them): header, m packed, payload
 * and, once keyed, the MAC. */
static uint8_t *fake_frame(struct fake *fk, unsigned type, const ProtobufCMessage *m,
			   const void *pay, uint64_t plen, size_t *len)
{
	size_t mlen = protobuf_c_message_get_packed_size(m);
	struct ps_frame_hdr fh = { .type = (uint8_t)type, .meta_len = (uint32_t)mlen,
				   .payload_len = plen };
	uint8_t *b = malloc(PS_WIRE_HDR_LEN + mlen + plen + PS_MAC_TAG_LEN);

	if (fk->keyed) {
		fh.flags |= PS_FRAME_F_MAC;
		fh.seq = (uint32_t)fk->sseq;
	}
	ps_wire_encode_hdr(b, &fh);
	protobuf_c_message_pack(m, b + PS_WIRE_HDR_LEN);
	if (plen)
		memcpy(b + PS_WIRE_HDR_LEN + mlen, pay, plen);
	*len = PS_WIRE_HDR_LEN + mlen + plen;
	if (fk->keyed) {
		struct ps_mac mac;
		ck_assert_int_eq(ps_mac_init(&mac), 0);
		ps_mac_begin(&mac, fk->keys.send, fk->sseq++);
		ps_mac_update(&mac, b, *len);
		ps_mac_end(&mac, b + *len);
		ps_mac_free(&mac);
		*len += PS_MAC_TAG_LEN;
	}
	return b;
}

/* Sends a frame (fake_frame's bytes). */
static int fake_send(struct fake *fk, unsigned type, const ProtobufCMessage *m, const void *pay,
		     uint64_t plen)
{
	size_t len;
	uint8_t *b = fake_frame(fk, type, m, pay, plen, &len);
	int rc = 0;

	for (size_t off = 0; off < len;) {
		ssize_t k = write(fk->fd, b + off, len - off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			rc = -1;
			break;
		}
		off += (size_t)k;
	}
	free(b);
	return rc;
}

/* Milliseconds until the client closes fd (what it sends is dropped), or
 * -1 if it is still open after ms (times tu_time_scale). */
static int fake_wait_closed(int fd, int ms)
{
	double t0 = now_ms(), deadline = t0 + ms * tu_time_scale();
	char b[4096];

	for (;;) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		int left = (int)(deadline - now_ms());
		if (poll(&pfd, 1, left > 0 ? left : 0) == 0)
			return -1;
		ssize_t k = read(fd, b, sizeof(b));
		if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN))
			return (int)(now_ms() - t0);
	}
}

/* The membership the fakes' pull replies name (nmembers 0: none, as a
 * shard of a fixed cluster), set by a test between its pulls. */
static struct {
	volatile uint64_t clock, epoch, before;
	volatile int nmembers;
	int32_t members[4];
} fake_members;

/* A PullReply for req_id naming the slices sl[0..n), each given as raw
 * float32 values all equal to v, with fake_members' membership. */
static int fake_pull_reply(struct fake *fk, uint64_t req_id, const struct ps_shardmap *map,
			   const uint32_t *sl, int n, float v)
{
	Ps__PullReply r = PS__PULL_REPLY__INIT;
	int32_t members[4];
	Ps__SliceRef refs[8], *rp[8];
	uint64_t plen = 0;
	float *pay;
	int rc;

	ck_assert_int_le(n, 8);
	for (int i = 0; i < n; i++)
		plen += (uint64_t)map->slices[sl[i]].count * sizeof(float);
	pay = malloc(plen + 4);
	for (uint64_t i = 0; i < plen / sizeof(float); i++)
		pay[i] = v;
	for (int i = 0, off = 0; i < n; i++) {
		ps__slice_ref__init(&refs[i]);
		refs[i].slice = sl[i];
		refs[i].offset = (uint64_t)off;
		refs[i].length = (uint64_t)map->slices[sl[i]].count * sizeof(float);
		refs[i].version = 1;
		off += (int)refs[i].length;
		rp[i] = &refs[i];
	}
	r.req_id = req_id;
	r.n_slices = (size_t)n;
	r.slices = rp;
	if (fake_members.nmembers) {
		r.has_members = 1;
		r.member_clock = fake_members.clock;
		r.member_epoch = fake_members.epoch;
		r.member_before = fake_members.before;
		r.n_members = (size_t)fake_members.nmembers;
		memcpy(members, fake_members.members, sizeof(members));
		r.members = members;
	}
	rc = fake_send(fk, PS_MSG_PULL_REPLY, &r.base, pay, plen);
	free(pay);
	return rc;
}

/* ---- the cluster ---- */

static struct ps_config cfg;
static struct ps_shardmap map;
static char path[64];
static uint8_t secret[PS_AUTH_KEY_LEN];
static int with_table; /* write_cfg adds table e (dim ROW_DIM) */
#define ROW_DIM 4 /* as write_cfg's yaml says */

static void write_cfg(int nshards, const int *ports)
{
	char yaml[2048], servers[256] = "", err[512];

	for (int i = 0; i < nshards; i++)
		snprintf(servers + strlen(servers), sizeof(servers) - strlen(servers), "%s127.0.0.1:%d",
			 i ? ", " : "", ports[i]);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n  workers: 1\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n%s"
		 "limits:\n  connect_timeout_ms: 5000\n  request_timeout_ms: 60000\n"
		 "  reconnect_timeout_ms: 60000\n"
		 "log:\n  level: info\n", servers, N,
		 with_table ? "  embeddings:\n    - {name: e, dim: 4}\n" : "");
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_auth_load_secret(&cfg, secret, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_uint_eq(map.nslices, 2);
}

static struct ps_client *connect_retry(void)
{
	struct ps_client *c = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 200; i++) {
		rc = ps_client_init(&c, &cfg, 0, err, sizeof(err));
		if (rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(50);
	}
	ck_assert_msg(rc == 0, "connect: %s", err);
	return c;
}

/* A shard dies; whoever binds its port next answers the worker's pending
 * pull and push before any handshake. The worker must close that
 * connection, keep both requests pending, and complete them against the
 * real shard once it is back: the push applied exactly once, the pull
 * returning init - g exactly (init: arange, index mod 1024). */
START_TEST(test_replies_before_handshake_ignored)
{
	static float g[N], w[N];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	int port = tu_free_port();
	pid_t pid;

	write_cfg(1, &port);
	setenv("PS_TEST_LOG", "info", 1); /* the log lines below are checked too */
	tu_capture_begin();
	pid = tu_start_server(path, 0);
	ck_assert_int_gt(pid, 0);
	struct ps_client *c = connect_retry();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);

	int lfd = fake_listen(port);
	for (int i = 0; i < N; i++) {
		g[i] = (float)(i % 5 - 2);
		w[i] = -7.0f;
	}
	int64_t p = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	int64_t q = ps_client_pull(c, 1, &tw, 1);
	ck_assert_int_gt(p, 0);
	ck_assert_int_gt(q, 0);

	/* the worker reconnects to the impostor: it says hello, and the
	 * impostor answers both requests at once, with no handshake */
	struct fake fk = { .fd = fake_accept(lfd, 10000) };
	ck_assert_msg(fk.fd >= 0, "the worker did not reconnect within 10 s");
	ProtobufCMessage *m = NULL;
	ck_assert_int_eq(fake_recv(&fk, &m, NULL, NULL, 5000), PS_MSG_HELLO);
	protobuf_c_message_free_unpacked(m, NULL);
	uint32_t both[2] = { 0, 1 };
	Ps__PushAck ack = PS__PUSH_ACK__INIT;
	ack.req_id = (uint64_t)p;
	ck_assert_int_eq(fake_send(&fk, PS_MSG_PUSH_ACK, &ack.base, NULL, 0), 0);
	ck_assert_int_eq(fake_pull_reply(&fk, (uint64_t)q, &map, both, 2, 666.0f), 0);
	ck_assert_msg(fake_wait_closed(fk.fd, 5000) >= 0,
		      "the worker kept a connection that sent replies before the handshake");
	close(fk.fd);
	/* it tries again: this time the impostor answers with statistics
	 * only, which close the connection just the same */
	fk = (struct fake){ .fd = fake_accept(lfd, 10000) };
	ck_assert_msg(fk.fd >= 0, "the worker did not reconnect a second time within 10 s");
	ck_assert_int_eq(fake_recv(&fk, &m, NULL, NULL, 5000), PS_MSG_HELLO);
	protobuf_c_message_free_unpacked(m, NULL);
	Ps__Stats fst = PS__STATS__INIT;
	ck_assert_int_eq(fake_send(&fk, PS_MSG_STATS, &fst.base, NULL, 0), 0);
	ck_assert_msg(fake_wait_closed(fk.fd, 5000) >= 0,
		      "the worker kept a connection that sent statistics before the handshake");
	close(fk.fd);
	close(lfd);
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == -7.0f, "w[%d] = %g written from an unauthenticated reply", i,
			      (double)w[i]);

	/* the real shard again (fresh: arange weights) */
	pid = tu_start_server(path, 0);
	ck_assert_int_gt(pid, 0);
	ck_assert_msg(ps_client_wait(c, p) == 0, "push: %s", ps_client_error(c));
	ck_assert_msg(ps_client_wait(c, q) == 0, "pull: %s", ps_client_error(c));
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == (float)(i % 1024) - g[i], "w[%d] = %g, want %g", i,
			      (double)w[i], (double)((float)(i % 1024) - g[i]));
	struct ps_shard_stats st;
	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	ck_assert_uint_eq(st.pushes, 1); /* applied exactly once, by the real shard */
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	/* what the operator reads: the impostor named, both requests sent
	 * again to the restarted shard, the worker's clean goodbye */
	char *log = tu_capture_end();
	ck_assert_msg(strstr(log, "it sent a push-ack frame before the handshake and "
			     "authentication completed"), "%s", log);
	ck_assert_msg(strstr(log, "it sent a stats frame before the handshake and "
			     "authentication completed"), "%s", log);
	ck_assert_msg(strstr(log, "to a restarted shard; 2 request(s) sent again"), "%s", log);
	ck_assert_msg(strstr(log, "worker 0 disconnected (closed)"), "%s", log);
	ck_assert_msg(strstr(log, "worker 0 connected from 127.0.0.1:") &&
		      strstr(log, "(authenticated, frames MACed)"), "%s", log);
	free(log);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* Whether the captured log (tu_capture_begin) holds needle within ms
 * (times tu_time_scale). */
static int capture_has(const char *needle, int ms)
{
	double deadline = now_ms() + ms * tu_time_scale();
	static char buf[65536];

	do {
		FILE *f = fopen(tu_capture_path, "r");
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = 0;
		if (strstr(buf, needle))
			return 1;
		tu_sleep_ms(50);
	} while (now_ms() < deadline);
	return 0;
}

/* A worker with nothing pending whose shard was killed and restarted
 * reconnects by itself and says it sent nothing again. A monitor that
 * comes and goes is logged as one. */
START_TEST(test_reconnect_nothing_pending)
{
	int port = tu_free_port();
	char *log = NULL;
	pid_t pid;

	write_cfg(1, &port);
	setenv("PS_TEST_LOG", "info", 1);
	tu_capture_begin();
	pid = tu_start_server(path, 0);
	struct ps_client *c = connect_retry();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	pid = tu_start_server(path, 0);
	/* the worker's own retries find it: wait for its log line */
	int found = 0;
	for (int i = 0; i < 200 && !found; i++) {
		FILE *f = fopen(tu_capture_path, "r");
		char buf[16384];
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = 0;
		found = strstr(buf, "reconnected after") != NULL;
		if (!found)
			tu_sleep_ms(50);
	}
	struct ps_client *mon = NULL;
	char err[512];
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	ps_client_free(mon);
	int mon_closed = capture_has("monitor connection from 127.0.0.1:", 5000);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unsetenv("PS_TEST_LOG");
	log = tu_capture_end();
	ck_assert_msg(found, "no reconnect within 10 s:\n%s", log);
	ck_assert_msg(mon_closed, "the monitor's close not logged as a monitor's:\n%s", log);
	ck_assert_msg(strstr(log, "to a restarted shard; 0 request(s) sent again"), "%s", log);
	free(log);
	unlink(path);
}
END_TEST

/* A stranger on a dead shard's port: it refuses every Hello, "go away". */
struct stranger {
	int lfd;
	volatile int stop;
	pthread_t th;
	double at[32]; /* when each connection came (ps_now_s) */
	int n;
};

static void *stranger_main(void *arg)
{
	struct stranger *st = arg;

	while (!st->stop) {
		struct fake fk = { .fd = fake_accept(st->lfd, 100) };
		ProtobufCMessage *m = NULL;
		if (fk.fd < 0)
			continue;
		if (st->n < 32)
			st->at[st->n++] = ps_now_s();
		if (fake_recv(&fk, &m, NULL, NULL, 2000) == PS_MSG_HELLO) {
			Ps__HelloReply r = PS__HELLO_REPLY__INIT;
			r.protocol_version = PS_PROTOCOL_VERSION;
			r.shard_map_hash = map.hash;
			r.error = "go away";
			fake_send(&fk, PS_MSG_HELLO_REPLY, &r.base, NULL, 0);
			fake_wait_closed(fk.fd, 2000);
		}
		if (m)
			protobuf_c_message_free_unpacked(m, NULL);
		close(fk.fd);
	}
	return NULL;
}

/* A shard killed and not restarted: a pull waiting for it fails once
 * limits.reconnect_timeout_ms (1 s here) has passed since the connection
 * was lost, long before its request timeout (15 s), naming the limit.
 * Case 0: nothing listens on the port (each attempt refused); case 1: a
 * listener that never answers (each attempt hangs until
 * connect_timeout_ms, 400 ms); case 2: a stranger that refuses each Hello,
 * whose last words the error quotes. */
START_TEST(test_reconnect_gives_up)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	static const char *const what[] = { "refused", "a hung listener", "a stranger" };
	struct stranger sg = { .lfd = -1 };
	int port = tu_free_port(), lfd = -1;
	pid_t pid;

	write_cfg(1, &port);
	pid = tu_start_server(path, 0);
	struct ps_client *c = connect_retry();
	/* the client's own copy of the limits is what it goes by */
	cfg.limits.reconnect_timeout_ms = 1000;
	cfg.limits.connect_timeout_ms = 400;
	cfg.limits.request_timeout_ms = 15000;
	ps_client_free(c);
	c = connect_retry();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	double t0 = ps_now_s();
	if (_i == 1)
		lfd = fake_listen(port);
	if (_i == 2) {
		sg.lfd = fake_listen(port);
		ck_assert_int_eq(pthread_create(&sg.th, NULL, stranger_main, &sg), 0);
	}
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	int rc = q > 0 ? ps_client_wait(c, q) : (int)q;
	double took = ps_now_s() - t0;
	fprintf(stderr, "it_fake_shard: reconnect given up after %.2f s (%s)\n", took, what[_i]);
	if (_i == 2) {
		sg.stop = 1;
		pthread_join(sg.th, NULL);
		close(sg.lfd);
	}
	/* the whole reason: the limit, and in case 2 the stranger's last
	 * words; no stranger answered in cases 0 and 1, so the error quotes
	 * none (the real shard's handshake cleared what an earlier one left) */
	char want[400];
	snprintf(want, sizeof(want), "shard 0 (127.0.0.1:%d): unreachable for 1000 ms "
		 "(limits.reconnect_timeout_ms)%s", port, _i == 2 ? "; the last answer, from a "
		 "peer that had not proven the secret: refused the handshake before proving the "
		 "secret: go away" : "");
	ck_assert_msg(rc == PS_ETIMEDOUT && strcmp(ps_client_error(c), want) == 0,
		      "%d (%s): '%s', '%s' expected", rc, ps_strerror(rc), ps_client_error(c), want);
	if (_i == 2) {
		/* the back-off, as the stranger saw the attempts come: 0.1 s
		 * after the loss, then each gap twice the one before (0.2 s,
		 * 0.4 s, ...); a sleep never ends early, so these bounds hold
		 * whatever the load */
		ck_assert_msg(sg.n >= 2, "%d attempts reached the stranger", sg.n);
		for (int i = 1; i < sg.n && i < 5; i++) /* 2 s at most: the cap */
			ck_assert_msg(sg.at[i] - sg.at[i - 1] >= 0.1 * (1 << i) - 0.005,
				      "attempt %d came %.3f s after the one before, %.1f s due", i + 1,
				      sg.at[i] - sg.at[i - 1], 0.1 * (1 << i));
	}
	ck_assert_msg(took >= 0.9, "given up after %.2f s, before the reconnect timeout", took);
	ck_assert_msg(took < 5.0 * tu_time_scale(), "given up after %.2f s: the reconnect timeout "
		      "is 1 s, the connect timeout 0.4 s", took);
	ps_client_free(c);
	if (lfd >= 0)
		close(lfd);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* After its shard died, a worker meets a stranger on the shard's port who
 * answers its Hello the ways only the real shard may end a handshake: a
 * refusal (its words laced with terminal escape sequences), a challenge
 * with a wrong proof, an ok without any challenge. None of it comes from a
 * peer that proved the secret: each time the worker must close the
 * connection and dial again, its push and pull still pending, and both
 * complete exactly once the real shard is back. The stranger's words reach
 * the log escaped. */
START_TEST(test_stranger_cannot_stop_retries)
{
	static float g[N], w[N];
	static const char evil[] = "\x1b]0;owned\x07\x1b[2Jgo away";
	static const char *const after[] = { "its shard died", "an unauthenticated refusal",
					     "a challenge with a wrong proof" };
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	int port = tu_free_port();
	pid_t pid;

	write_cfg(1, &port);
	setenv("PS_TEST_LOG", "info", 1);
	tu_capture_begin();
	pid = tu_start_server(path, 0);
	ck_assert_int_gt(pid, 0);
	struct ps_client *c = connect_retry();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);

	int lfd = fake_listen(port);
	for (int i = 0; i < N; i++) {
		g[i] = (float)(i % 5 - 2);
		w[i] = -7.0f;
	}
	int64_t p = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	int64_t q = ps_client_pull(c, 1, &tw, 1);
	ck_assert_int_gt(p, 0);
	ck_assert_int_gt(q, 0);
	for (int round = 0; round < 3; round++) {
		struct fake fk = { .fd = fake_accept(lfd, 10000) };
		ProtobufCMessage *m = NULL;
		ck_assert_msg(fk.fd >= 0, "the worker did not dial again within 10 s after %s",
			      after[round]);
		ck_assert_int_eq(fake_recv(&fk, &m, NULL, NULL, 5000), PS_MSG_HELLO);
		protobuf_c_message_free_unpacked(m, NULL);
		if (round == 1) {
			uint8_t nonce[PS_AUTH_NONCE_LEN], proof[PS_AUTH_PROOF_LEN];
			Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
			ps_auth_random(nonce, sizeof(nonce));
			ps_auth_random(proof, sizeof(proof)); /* not made with the secret */
			ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
			ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
			ck_assert_int_eq(fake_send(&fk, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0), 0);
		} else {
			Ps__HelloReply r = PS__HELLO_REPLY__INIT;
			r.protocol_version = PS_PROTOCOL_VERSION;
			r.shard_map_hash = map.hash;
			r.ok = round == 2;
			r.error = round == 2 ? "" : (char *)evil;
			ck_assert_int_eq(fake_send(&fk, PS_MSG_HELLO_REPLY, &r.base, NULL, 0), 0);
		}
		ck_assert_msg(fake_wait_closed(fk.fd, 5000) >= 0, "round %d: the worker kept the "
			      "stranger's connection", round);
		close(fk.fd);
	}
	close(lfd);
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == -7.0f, "w[%d] = %g written without the real shard", i,
			      (double)w[i]);

	/* the real shard again (fresh: arange weights): nothing was given up */
	pid = tu_start_server(path, 0);
	ck_assert_int_gt(pid, 0);
	ck_assert_msg(ps_client_wait(c, p) == 0, "push: %s", ps_client_error(c));
	ck_assert_msg(ps_client_wait(c, q) == 0, "pull: %s", ps_client_error(c));
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == (float)(i % 1024) - g[i], "w[%d] = %g, want %g", i,
			      (double)w[i], (double)((float)(i % 1024) - g[i]));
	struct ps_shard_stats st;
	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	ck_assert_uint_eq(st.pushes, 1);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(pid), 0);
	unsetenv("PS_TEST_LOG");
	char *log = tu_capture_end();
	ck_assert_msg(!strchr(log, '\x1b'), "an escape sequence from the stranger reached the log");
	ck_assert_msg(strstr(log, "refused the handshake before proving the secret: "
			     "\\x1b]0;owned\\x07\\x1b[2Jgo away; closing the connection and dialing "
			     "again"), "%s", log);
	ck_assert_msg(strstr(log, "the shard's proof does not match"), "%s", log);
	ck_assert_msg(strstr(log, "the shard accepted this process without authentication"),
		      "%s", log);
	ck_assert_msg(strstr(log, "to a restarted shard; 2 request(s) sent again"), "%s", log);
	free(log);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* A program on libps that leaves SIGPIPE as it is (its default action ends
 * the process) and a shard that resets the connection just as the client
 * answers its challenge: the client's write fails, ps_client_init reports
 * the lost connection, and the program lives on to handle it. */
START_TEST(test_client_survives_reset_under_write)
{
	int port = tu_free_port();

	write_cfg(1, &port);
	int lfd = fake_listen(port);
	pid_t child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		struct ps_client *c = NULL;
		char err[512];
		signal(SIGPIPE, SIG_DFL);
		if (ps_client_init(&c, &cfg, 0, err, sizeof(err)) == 0) {
			ps_client_free(c);
			_exit(0);
		}
		fprintf(stderr, "ps_client_init: %s\n", err);
		_exit(strstr(err, "shard 0") ? 3 : 4);
	}
	struct fake fk = { .fd = fake_accept(lfd, 10000) };
	uint8_t hello[1024], nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
	size_t hlen = sizeof(hello), len;
	ProtobufCMessage *m = NULL;
	ck_assert_msg(fk.fd >= 0, "the client did not connect");
	ck_assert_int_eq(fake_recv(&fk, &m, hello, &hlen, 5000), PS_MSG_HELLO);
	protobuf_c_message_free_unpacked(m, NULL);
	/* a challenge with the right proof: the client answers it at once */
	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(hello, hlen, nonce, t);
	ps_auth_proof(secret, t, 1, proof);
	Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
	ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
	ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	uint8_t *b = fake_frame(&fk, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0, &len);
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	ck_assert_int_eq(getpeername(fk.fd, (struct sockaddr *)&sa, &sl), 0);
	int gone = tu_reset_while_stopped(child, ntohs(sa.sin_port), fk.fd, b, len);
	free(b);
	close(lfd);
	ck_assert_msg(gone > 0, "the reset did not reach the client's socket");
	int st = tu_wait_child(child);
	ck_assert_msg(st != 128 + SIGPIPE, "the libps program died of SIGPIPE: its client "
		      "wrote into the connection the shard had reset");
	ck_assert_msg(st == 3, "the libps program exited with %d, expected 3 (ps_client_init "
		      "failing, naming shard 0)", st);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* Two fake shards that hold the secret: each completes the handshake
 * (proof, session keys, MACed frames) and answers pulls as `mode` says. */
enum { ANSWER_RIGHT, ANSWER_FOREIGN_SLICE, ANSWER_AFTER_UNEXPECTED, ANSWER_NEVER,
       /* malformed replies of the shard's own slice (fake_bad_pull_reply) */
       BAD_CODEC, BAD_RAW_SHORT, BAD_PAST_PAYLOAD, BAD_OFFSET_PAST, BAD_UNKNOWN_SLICE,
       BAD_FP16_SECOND_SHORT, BAD_NO_SLICE, BAD_SLICE_TWICE, BAD_END };

struct fake_shard {
	int port, shard, lfd;
	volatile int mode; /* changed by the test between pulls */
	pthread_t th;
	volatile int stop;
	int pulls; /* pulls answered */
	volatile int held; /* pulls left unanswered (ANSWER_NEVER) */
	volatile int delay_ms; /* before each answer */
	volatile int rows_mode; /* how row pulls are answered (fake_rows_reply) */
	volatile int push_lie; /* each push answered first by a pull reply of its id */
	volatile int pushes; /* pushes acknowledged */
};

/* Answers to a row pull: every row's values 100 + shard, or broken. */
enum { ROWS_RIGHT, ROWS_FEWER, ROWS_DIM, ROWS_CODEC, ROWS_SHORT, ROWS_END };

/* A PullRowsReply for q as mode says, its payload the rows asked for (one
 * float short with ROWS_SHORT) whatever its fields say: ROWS_FEWER names
 * one row fewer, ROWS_DIM dim + 1, ROWS_CODEC codec 2 (neither raw nor
 * fp16); so each lie is caught by its own check alone. */
static int fake_rows_reply(struct fake *fk, const Ps__PullRows *q, int mode, float v)
{
	Ps__PullRowsReply r = PS__PULL_ROWS_REPLY__INIT;
	size_t vals = (size_t)q->n_ids * q->dim;
	size_t bytes = mode == ROWS_CODEC ? vals * 2 /* as a 16-bit codec would */
		       : vals * sizeof(float) - (mode == ROWS_SHORT ? 4 : 0);
	float *pay = malloc(vals * sizeof(float) + 1);
	int rc;

	for (size_t i = 0; i < vals; i++)
		pay[i] = v;
	r.req_id = q->req_id;
	r.n_rows = q->n_ids - (mode == ROWS_FEWER);
	r.dim = q->dim + (mode == ROWS_DIM);
	r.codec = mode == ROWS_CODEC ? 2 : 0;
	r.version = 1;
	rc = fake_send(fk, PS_MSG_PULL_ROWS_REPLY, &r.base, pay, bytes);
	free(pay);
	return rc;
}

/* A PullReply for req_id of slice s (the shard's own) broken as mode
 * says, its values 100 + shard where there are any:
 *  BAD_CODEC: codec 3 (neither raw nor fp16);
 *  BAD_RAW_SHORT: raw, one float short of the slice;
 *  BAD_PAST_PAYLOAD: raw, its bytes running 4 past the payload's end;
 *  BAD_OFFSET_PAST: raw, starting 8 bytes past the payload's end;
 *  BAD_UNKNOWN_SLICE: a slice number past the map's;
 *  BAD_FP16_SECOND_SHORT: the slice twice, right in raw, then in fp16 one
 *  value short (a decode failing after the first was copied);
 *  BAD_NO_SLICE: a reply naming no slice (the shard's left out);
 *  BAD_SLICE_TWICE: the slice twice, both right (one too many). */
static int fake_bad_pull_reply(struct fake *fk, uint64_t req_id, uint32_t s, int mode, float v)
{
	Ps__PullReply r = PS__PULL_REPLY__INIT;
	Ps__SliceRef refs[2], *rp[2] = { &refs[0], &refs[1] };
	uint64_t raw = (uint64_t)map.slices[s].count * sizeof(float), plen = raw;
	float *pay = malloc(raw);
	int rc;

	for (uint64_t i = 0; i < raw / sizeof(float); i++)
		pay[i] = v;
	for (int i = 0; i < 2; i++) {
		ps__slice_ref__init(&refs[i]);
		refs[i].slice = s;
		refs[i].length = raw;
		refs[i].version = 1;
	}
	r.n_slices = 1;
	switch (mode) {
	case BAD_CODEC: refs[0].codec = 3; break;
	case BAD_RAW_SHORT: refs[0].length = raw - 4; break;
	case BAD_PAST_PAYLOAD: refs[0].offset = 4; break;
	case BAD_OFFSET_PAST: refs[0].offset = plen + 8; break;
	case BAD_UNKNOWN_SLICE: refs[0].slice = (uint32_t)map.nslices; break;
	case BAD_FP16_SECOND_SHORT:
		r.n_slices = 2;
		refs[1].codec = PS_CODEC_FP16;
		refs[1].length = (uint64_t)map.slices[s].count * 2 - 2;
		break;
	case BAD_NO_SLICE: r.n_slices = 0; break;
	case BAD_SLICE_TWICE: r.n_slices = 2; break;
	}
	r.req_id = req_id;
	r.slices = rp;
	rc = fake_send(fk, PS_MSG_PULL_REPLY, &r.base, pay, plen);
	free(pay);
	return rc;
}

static void fake_handshake(struct fake *fk, int shard)
{
	uint8_t hello[1024], nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
	size_t hlen = sizeof(hello);
	ProtobufCMessage *m = NULL;

	ck_assert_int_eq(fake_recv(fk, &m, hello, &hlen, 5000), PS_MSG_HELLO);
	uint64_t hash = ((Ps__Hello *)m)->shard_map_hash;
	protobuf_c_message_free_unpacked(m, NULL);
	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(hello, hlen, nonce, t);
	ps_auth_proof(secret, t, 1, proof);
	Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
	ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
	ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	ck_assert_int_eq(fake_send(fk, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0), 0);
	ck_assert_int_eq(fake_recv(fk, &m, NULL, NULL, 5000), PS_MSG_AUTH);
	Ps__Auth *a = (Ps__Auth *)m;
	ck_assert(ps_auth_proof_ok(secret, t, 0, a->proof.data, a->proof.len));
	protobuf_c_message_free_unpacked(m, NULL);
	ps_auth_session_keys(secret, t, 1, &fk->keys);
	fk->keyed = 1;
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;
	r.ok = 1;
	r.error = "";
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard = shard;
	r.shard_map_hash = hash;
	r.boot_id = 77;
	ck_assert_int_eq(fake_send(fk, PS_MSG_HELLO_REPLY, &r.base, NULL, 0), 0);
}

/* The client's connection to a fake shard's listening socket lfd, its
 * handshake done as shard `shard`: 0, or -1 when *stop came first. */
static int fake_serve_start(struct fake *fk, int lfd, int shard, volatile int *stop)
{
	*fk = (struct fake){ .fd = -1 };
	while (!*stop && fk->fd < 0)
		fk->fd = fake_accept(lfd, 100);
	if (fk->fd < 0)
		return -1;
	fake_handshake(fk, shard);
	return 0;
}

/* The next frame of the client (its message in *m): its type, 0 when none
 * began within 100 ms, or < 0 when the connection ended. A frame begun
 * within the 100 ms gets its own deadline: one whose header came just
 * before the poll's end is read whole. */
static int fake_next(struct fake *fk, ProtobufCMessage **m)
{
	struct pollfd pfd = { fk->fd, POLLIN, 0 };

	*m = NULL;
	if (poll(&pfd, 1, 100) != 1)
		return 0;
	return fake_recv(fk, m, NULL, NULL, 5000);
}

/* Check asserts abort only the test's own process; in this thread they
 * would too, which fails the case as it should. */
static void *fake_shard_main(void *arg)
{
	struct fake_shard *fs = arg;
	struct fake fk;

	if (fake_serve_start(&fk, fs->lfd, fs->shard, &fs->stop))
		return NULL;
	while (!fs->stop) {
		ProtobufCMessage *m;
		int type = fake_next(&fk, &m);
		if (type <= 0)
			continue; /* nothing yet, or the client went: stop ends it */
		if (type == PS_MSG_PULL) {
			Ps__Pull *q = (Ps__Pull *)m;
			uint32_t sl[8];
			int n = 0;
			if (fs->mode == ANSWER_NEVER) {
				fs->held++;
				protobuf_c_message_free_unpacked(m, NULL);
				continue;
			}
			for (size_t i = 0; i < q->n_slices && n < 8; i++)
				sl[n++] = q->slices[i];
			if (fs->delay_ms)
				tu_sleep_ms(fs->delay_ms);
			if (fs->mode == ANSWER_AFTER_UNEXPECTED) {
				/* a request type no shard sends, before the reply */
				Ps__Pull x = PS__PULL__INIT;
				ck_assert_int_eq(fake_send(&fk, PS_MSG_PULL, &x.base, NULL, 0), 0);
			}
			if (fs->mode == ANSWER_FOREIGN_SLICE)
				for (int i = 0; i < n; i++)
					sl[i] = (uint32_t)(map.slices[0].shard == fs->shard ? 1 : 0);
			if (fs->mode >= BAD_CODEC)
				ck_assert_int_eq(fake_bad_pull_reply(&fk, q->req_id, sl[0], fs->mode,
								     100.0f + (float)fs->shard), 0);
			else
				ck_assert_int_eq(fake_pull_reply(&fk, q->req_id, &map, sl, n,
								 100.0f + (float)fs->shard), 0);
			fs->pulls++;
		} else if (type == PS_MSG_PULL_ROWS) {
			ck_assert_int_eq(fake_rows_reply(&fk, (Ps__PullRows *)m, fs->rows_mode,
							 100.0f + (float)fs->shard), 0);
		} else if (type == PS_MSG_PUSH) {
			Ps__Push *q = (Ps__Push *)m;
			uint32_t sl[8];
			int n = 0;
			for (size_t i = 0; i < q->n_slices && n < 8; i++)
				sl[n++] = q->slices[i]->slice;
			/* a pull reply under the push's id, of the very slices
			 * pushed: the client must not take it for the ack, nor
			 * write its values anywhere */
			if (fs->push_lie)
				ck_assert_int_eq(fake_pull_reply(&fk, q->req_id, &map, sl, n,
								 100.0f + (float)fs->shard), 0);
			Ps__PushAck a = PS__PUSH_ACK__INIT;
			a.req_id = q->req_id;
			ck_assert_int_eq(fake_send(&fk, PS_MSG_PUSH_ACK, &a.base, NULL, 0), 0);
			fs->pushes++;
		}
		protobuf_c_message_free_unpacked(m, NULL);
	}
	close(fk.fd);
	return NULL;
}

static void fake_shards_start(struct fake_shard fs[2], int mode1)
{
	int ports[2] = { tu_free_port(), tu_free_port() };

	write_cfg(2, ports);
	ck_assert_int_ne(map.slices[0].shard, map.slices[1].shard); /* one slice each */
	for (int i = 0; i < 2; i++) {
		fs[i] = (struct fake_shard){ .port = ports[i], .shard = i,
					     .mode = i == 1 ? mode1 : ANSWER_RIGHT };
		fs[i].lfd = fake_listen(ports[i]);
		ck_assert_int_eq(pthread_create(&fs[i].th, NULL, fake_shard_main, &fs[i]), 0);
	}
}

static void fake_shards_stop(struct fake_shard fs[2])
{
	for (int i = 0; i < 2; i++) {
		fs[i].stop = 1;
		pthread_join(fs[i].th, NULL);
		close(fs[i].lfd);
	}
	ps_shardmap_free(&map);
	unlink(path);
}

/* c's pull of tensor a into w (N floats), answered honestly by both fake
 * shards: each value is 100 + the shard that holds it. */
static void pull_honest(struct ps_client *c, float *w)
{
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	int64_t q = ps_client_pull(c, 0, &tw, 1);

	ck_assert_int_gt(q, 0);
	ck_assert_msg(ps_client_wait(c, q) == 0, "%s", ps_client_error(c));
	for (int i = 0; i < N; i++) {
		const struct ps_slice *sl = &map.slices[i < (int)map.slices[0].count ? 0 : 1];
		ck_assert_msg(w[i] == 100.0f + (float)sl->shard, "w[%d] = %g", i, (double)w[i]);
	}
}

/* The control: honest replies from the two fakes are taken, so the
 * refusal below is the slice check's doing and not the harness's. */
START_TEST(test_fake_shards_answer_right)
{
	static float w[N];
	struct fake_shard fs[2];

	fake_shards_start(fs, ANSWER_RIGHT);
	struct ps_client *c = connect_retry();
	pull_honest(c, w);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* An authenticated shard answers each push first with a pull reply under
 * the push's id (the very slices pushed, values 100 + shard), then with
 * the push's ack: the reply is not taken for a pull's (the gradients the
 * caller pushed are not overwritten, nothing crashes), the push completes
 * with the ack, and a pull after it is answered as usual. */
START_TEST(test_pull_reply_to_push_ignored)
{
	static float w[N], g[N];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	struct fake_shard fs[2];

	fake_shards_start(fs, ANSWER_RIGHT);
	fs[0].push_lie = fs[1].push_lie = 1;
	struct ps_client *c = connect_retry();
	for (int i = 0; i < N; i++)
		g[i] = 0.25f * (float)i;
	for (int k = 0; k < 3; k++) {
		int64_t q = ps_client_push(c, (uint64_t)k, &tg, 1, 0);
		ck_assert_int_gt(q, 0);
		ck_assert_msg(ps_client_wait(c, q) == 0, "push %d: %s", k, ps_client_error(c));
		for (int i = 0; i < N; i++)
			ck_assert_msg(g[i] == 0.25f * (float)i, "push %d: the gradient g[%d] = %g "
				      "written from a pull reply", k, i, (double)g[i]);
	}
	ck_assert_int_eq(fs[0].pushes + fs[1].pushes, 6);
	pull_honest(c, w);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* An authenticated shard answers a pull with the slice the other shard
 * holds: the pull fails as malformed, and the caller's copy of that slice
 * is not overwritten with the liar's values. */
START_TEST(test_foreign_slice_refused)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct fake_shard fs[2];

	fake_shards_start(fs, ANSWER_FOREIGN_SLICE);
	struct ps_client *c = connect_retry();
	for (int i = 0; i < N; i++)
		w[i] = -7.0f;
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	ck_assert_int_gt(q, 0);
	ck_assert_int_eq(ps_client_wait(c, q), PS_EPROTO);
	ck_assert_msg(strstr(ps_client_error(c), "shard 1 sent a malformed pull reply"), "%s",
		      ps_client_error(c));
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] != 101.0f, "w[%d] written by shard 1's reply for a slice it "
			      "does not hold", i);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* ---- refusals of the handshake: the whole text and the code ---- */

/* The shard's side of one handshake gone wrong, as variant says. Before
 * any challenge: an ok without one (R_OK_UNAUTHED), a refusal (its words
 * with a terminal escape: R_REFUSED_UNAUTHED, and R_REFUSED_AUTH_OFF to a
 * client with security.auth off), a reply frame (R_REPLY_EARLY), metadata
 * that does not unpack (R_GARBAGE). A challenge with a nonce one byte
 * short or long (R_NONCE_31, R_NONCE_33; R_NONCE_32, the control, is the
 * whole handshake, after a Hello frame of its own that the client warns
 * about and passes over: R_UNEXPECTED_FIRST), with a wrong proof
 * (R_WRONG_PROOF), to a client with security.auth off (R_TO_AUTH_OFF), a
 * second one after the client's proof (R_TWICE), a refusal of a setting
 * after the secret was proven (R_REFUSED_AUTHED). */
enum { R_NONCE_31, R_NONCE_33, R_NONCE_32, R_TWICE, R_TO_AUTH_OFF, R_WRONG_PROOF,
       R_OK_UNAUTHED, R_REFUSED_UNAUTHED, R_REFUSED_AUTH_OFF, R_REFUSED_AUTHED, R_REPLY_EARLY,
       R_GARBAGE, R_UNEXPECTED_FIRST, R_END };

struct challenger {
	int lfd, variant;
	int closed_ms; /* until the client closed the connection; -1: it did not */
};

static const uint8_t garbage_meta[] = { 0xff, 0xff, 0xff, 0xff, 0x0f };

/* Sends a frame whose metadata is meta as it is (not keyed). */
static void fake_send_raw(struct fake *fk, unsigned type, const uint8_t *meta, uint32_t mlen)
{
	struct ps_frame_hdr fh = { .type = (uint8_t)type, .meta_len = mlen };
	uint8_t b[PS_WIRE_HDR_LEN + 64];

	ck_assert_uint_le(mlen, 64);
	ps_wire_encode_hdr(b, &fh);
	memcpy(b + PS_WIRE_HDR_LEN, meta, mlen);
	ck_assert_int_eq(write(fk->fd, b, PS_WIRE_HDR_LEN + mlen), (ssize_t)(PS_WIRE_HDR_LEN + mlen));
}

/* The challenger's end: how long until the client closed the connection. */
static void *challenger_done(struct challenger *ch, struct fake *fk)
{
	ch->closed_ms = fake_wait_closed(fk->fd, 5000);
	close(fk->fd);
	return NULL;
}

static void *challenger_main(void *arg)
{
	struct challenger *ch = arg;
	struct fake fk = { .fd = fake_accept(ch->lfd, 5000) };
	uint8_t hello[1024], nonce[PS_AUTH_NONCE_LEN + 1], t[32], proof[PS_AUTH_PROOF_LEN];
	size_t hlen = sizeof(hello);
	ProtobufCMessage *m = NULL;
	int v = ch->variant;

	ch->closed_ms = -1;
	if (fk.fd < 0)
		return NULL;
	if (v == R_NONCE_32 || v == R_UNEXPECTED_FIRST) {
		if (v == R_UNEXPECTED_FIRST) {
			Ps__Hello h = PS__HELLO__INIT;
			ck_assert_int_eq(fake_send(&fk, PS_MSG_HELLO, &h.base, NULL, 0), 0);
		}
		fake_handshake(&fk, 0);
		return challenger_done(ch, &fk);
	}
	ck_assert_int_eq(fake_recv(&fk, &m, hello, &hlen, 5000), PS_MSG_HELLO);
	uint64_t hash = ((Ps__Hello *)m)->shard_map_hash;
	protobuf_c_message_free_unpacked(m, NULL);
	Ps__HelloReply r = PS__HELLO_REPLY__INIT;
	r.protocol_version = PS_PROTOCOL_VERSION;
	r.shard_map_hash = hash;
	r.error = v == R_REFUSED_UNAUTHED ? "\x1b[2Jgo away" : "go away";
	switch (v) {
	case R_OK_UNAUTHED:
		r.ok = 1;
		r.error = "";
		/* fall through */
	case R_REFUSED_UNAUTHED:
	case R_REFUSED_AUTH_OFF:
		ck_assert_int_eq(fake_send(&fk, PS_MSG_HELLO_REPLY, &r.base, NULL, 0), 0);
		return challenger_done(ch, &fk);
	case R_REPLY_EARLY: {
		Ps__Stats st = PS__STATS__INIT;
		ck_assert_int_eq(fake_send(&fk, PS_MSG_STATS, &st.base, NULL, 0), 0);
		return challenger_done(ch, &fk);
	}
	case R_GARBAGE:
		fake_send_raw(&fk, PS_MSG_HELLO_REPLY, garbage_meta, sizeof(garbage_meta));
		return challenger_done(ch, &fk);
	}
	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(hello, hlen, nonce, t);
	ps_auth_proof(secret, t, 1, proof);
	if (v == R_WRONG_PROOF)
		proof[7] ^= 1;
	Ps__AuthChallenge c = PS__AUTH_CHALLENGE__INIT;
	c.nonce = (ProtobufCBinaryData){ v == R_NONCE_31 ? PS_AUTH_NONCE_LEN - 1 :
					 v == R_NONCE_33 ? PS_AUTH_NONCE_LEN + 1 :
					 PS_AUTH_NONCE_LEN, nonce };
	c.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	ck_assert_int_eq(fake_send(&fk, PS_MSG_AUTH_CHALLENGE, &c.base, NULL, 0), 0);
	if (v == R_TWICE || v == R_REFUSED_AUTHED) {
		ck_assert_int_eq(fake_recv(&fk, &m, NULL, NULL, 5000), PS_MSG_AUTH);
		protobuf_c_message_free_unpacked(m, NULL);
		ps_auth_session_keys(secret, t, 1, &fk.keys);
		fk.keyed = 1;
		if (v == R_TWICE) {
			ck_assert_int_eq(fake_send(&fk, PS_MSG_AUTH_CHALLENGE, &c.base, NULL, 0), 0);
		} else {
			/* a setting that differs, as config_agree words it */
			r.error = "optimizer.lr: the shard has 0.5";
			ck_assert_int_eq(fake_send(&fk, PS_MSG_HELLO_REPLY, &r.base, NULL, 0), 0);
		}
	}
	return challenger_done(ch, &fk);
}

/* A worker's first connection meets each refusal above: ps_client_init
 * fails with the code and the whole text, which names the shard (a
 * changed word, a dropped or swapped argument fails the case), and the
 * connection is closed: nothing of the shard's is believed. A nonce of
 * exactly 32 bytes is taken (both sides of the length's limit), and so
 * is a handshake after an unexpected frame, which is logged whole. */
START_TEST(test_bad_challenges_refused)
{
	static const char *const what[R_END] = {
		[R_NONCE_31] = "auth-challenge with a 31-byte nonce",
		[R_NONCE_33] = "auth-challenge with a 33-byte nonce",
		[R_TWICE] = "unexpected auth-challenge",
		[R_TO_AUTH_OFF] = "the shard requires authentication and this process has "
				  "security.auth: false; the two configs must agree",
		[R_WRONG_PROOF] = "authentication failed: the shard's proof does not match this "
				  "process's secret (the secret files differ)",
		[R_OK_UNAUTHED] = "the shard accepted this process without authentication "
				  "(security.auth: false there, true here); refusing it, the two "
				  "configs must agree",
		[R_REFUSED_UNAUTHED] = "refused the handshake before proving the secret: "
				       "\\x1b[2Jgo away",
		[R_REFUSED_AUTH_OFF] = "refused the handshake: go away",
	};
	static const int code[R_END] = {
		[R_NONCE_31] = PS_EPROTO, [R_NONCE_33] = PS_EPROTO, [R_TWICE] = PS_EPROTO,
		[R_TO_AUTH_OFF] = PS_EAUTH, [R_WRONG_PROOF] = PS_EAUTH, [R_OK_UNAUTHED] = PS_EAUTH,
		[R_REFUSED_UNAUTHED] = PS_EREFUSED, [R_REFUSED_AUTH_OFF] = PS_EREFUSED,
		[R_REFUSED_AUTHED] = PS_EREFUSED, [R_REPLY_EARLY] = PS_EPROTO,
		[R_GARBAGE] = PS_EPROTO,
	};
	static struct ps_config off;
	int port = tu_free_port();
	char err[512], want[600], line[600], unpack_why[200];

	write_cfg(1, &port);
	memcpy(&off, &cfg, sizeof(off));
	off.security.auth = 0;
	/* the reason ps_msg_unpack gives for the garbage, as the client logs it */
	struct ps_frame gf = { .hdr = { .type = PS_MSG_HELLO_REPLY,
				       .meta_len = sizeof(garbage_meta) },
			       .meta = (uint8_t *)garbage_meta };
	ck_assert_ptr_null(ps_msg_unpack(&gf, unpack_why, sizeof(unpack_why)));
	int lfd = fake_listen(port);
	for (int v = 0; v < R_END; v++) {
		struct challenger ch = { .lfd = lfd, .variant = v };
		struct ps_client *c = NULL;
		pthread_t th;
		const struct ps_config *cc = v == R_TO_AUTH_OFF || v == R_REFUSED_AUTH_OFF ? &off : &cfg;

		tu_capture_begin();
		ck_assert_int_eq(pthread_create(&th, NULL, challenger_main, &ch), 0);
		err[0] = 0;
		int rc = ps_client_init(&c, cc, 0, err, sizeof(err));
		if (rc == 0)
			ps_client_free(c); /* the control: closes the connection */
		pthread_join(th, NULL);
		char *log = tu_capture_end();
		line[0] = 0;
		if (v == R_NONCE_32 || v == R_UNEXPECTED_FIRST) {
			want[0] = 0;
			if (v == R_UNEXPECTED_FIRST)
				snprintf(line, sizeof(line), "shard 0 sent an unexpected hello frame\n");
		} else if (v == R_REFUSED_AUTHED) {
			/* an authenticated refusal: the shard's words and this
			 * worker's own value of the setting */
			snprintf(want, sizeof(want), "shard 0 (127.0.0.1:%d) refused the handshake: "
				 "optimizer.lr: the shard has 0.5; this worker has 1", port);
		} else if (v == R_REPLY_EARLY || v == R_GARBAGE) {
			snprintf(want, sizeof(want), "shard 0 (127.0.0.1:%d): connection lost: %s", port,
				 ps_strerror(PS_EPROTO));
			if (v == R_REPLY_EARLY)
				snprintf(line, sizeof(line), "closing connection to shard 0 (127.0.0.1:%d): "
					 "it sent a stats frame before the handshake and "
					 "authentication completed\n", port);
			else
				snprintf(line, sizeof(line), "closing connection to shard 0: %s\n",
					 unpack_why);
		} else {
			snprintf(want, sizeof(want), "shard 0 (127.0.0.1:%d): %s", port, what[v]);
		}
		ck_assert_msg(rc == (want[0] ? code[v] : 0) && strcmp(err, want) == 0,
			      "variant %d: %d (%s), '%s'; %d, '%s' expected", v, rc, ps_strerror(rc),
			      err, want[0] ? code[v] : 0, want);
		ck_assert_msg(!line[0] || strstr(log, line), "variant %d: no line '%s' in:\n%s", v,
			      line, log);
		ck_assert_msg(ch.closed_ms >= 0, "variant %d: the connection was left open", v);
		free(log);
	}
	close(lfd);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* The membership a pull reply names (ps_client_members): taken from
 * the newest clock's reply, an older clock's reply that comes after it
 * (from another shard, late) does not turn it back. */
START_TEST(test_members_not_turned_back)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct ps_members_info mi;
	struct fake_shard fs[2];
	static const struct {
		uint64_t clock, epoch, before;
		int n;
		int32_t m[4];
		uint64_t want_clock;
		int want_count, want_index;
	} step[] = {
		{ 5, 1, 12, 2, { 0, 1 }, 5, 2, 0 },      /* clock 5: ranks 0 and 1 */
		{ 7, 2, 16, 3, { 1, 0, 2 }, 7, 3, 1 },  /* a later clock: taken */
		{ 6, 1, 14, 1, { 1 }, 7, 3, 1 },        /* an older one after it: not */
		{ 7, 2, 16, 3, { 1, 0, 2 }, 7, 3, 1 },  /* the same clock again */
		{ 9, 3, 22, 2, { 1, 2 }, 9, 2, -1 },    /* later, rank 0 not a member */
	};

	fake_shards_start(fs, ANSWER_RIGHT);
	struct ps_client *c = connect_retry();
	/* a fixed cluster's (cluster.workers 1): before any reply names one */
	ck_assert_int_eq(ps_client_members(c, &mi), 0);
	ck_assert_int_eq(mi.count, 1);
	ck_assert_int_eq(mi.index, 0);
	for (size_t i = 0; i < sizeof(step) / sizeof(step[0]); i++) {
		fake_members.nmembers = 0;
		fake_members.clock = step[i].clock;
		fake_members.epoch = step[i].epoch;
		fake_members.before = step[i].before;
		memcpy(fake_members.members, step[i].m, sizeof(step[i].m));
		fake_members.nmembers = step[i].n;
		int64_t q = ps_client_pull(c, 0, &tw, 1);
		ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "%s", ps_client_error(c));
		ck_assert_int_eq(ps_client_members(c, &mi), 0);
		ck_assert_msg(mi.clock == step[i].want_clock && mi.count == step[i].want_count &&
			      mi.index == step[i].want_index,
			      "step %zu (a reply of clock %llu): members of clock %llu, %d, index %d; "
			      "clock %llu, %d, index %d due", i, (unsigned long long)step[i].clock,
			      (unsigned long long)mi.clock, mi.count, mi.index,
			      (unsigned long long)step[i].want_clock, step[i].want_count,
			      step[i].want_index);
	}
	fake_members.nmembers = 0;
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* An authenticated shard answers pulls with replies of its own slice that
 * do not add up: another codec, a length that is not the slice's, bytes
 * past the payload, a slice the map does not have, a second copy of the
 * slice in fp16 that does not decode. Each fails the pull as malformed
 * naming the shard, and none of shard 1's values reaches the weights
 * (every slice is checked before any is written); then an honest reply on
 * the same connection is taken. */
START_TEST(test_malformed_pull_replies)
{
	static const char *what[] = { "codec 3", "raw, one float short", "past the payload",
				      "offset past the payload", "unknown slice",
				      "fp16 copy one value short", "no slice", "the slice twice" };
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct fake_shard fs[2];

	fake_shards_start(fs, BAD_CODEC);
	struct ps_client *c = connect_retry();
	for (int mode = BAD_CODEC; mode < BAD_END; mode++) {
		fs[1].mode = mode;
		for (int i = 0; i < N; i++)
			w[i] = -7.0f;
		int64_t q = ps_client_pull(c, 0, &tw, 1);
		ck_assert_int_gt(q, 0);
		int rc = ps_client_wait(c, q);
		ck_assert_msg(rc == PS_EPROTO, "%s: %s (%s)", what[mode - BAD_CODEC], ps_strerror(rc),
			      ps_client_error(c));
		ck_assert_msg(strstr(ps_client_error(c), "shard 1 sent a malformed pull reply"),
			      "%s: %s", what[mode - BAD_CODEC], ps_client_error(c));
		for (int i = 0; i < N; i++)
			ck_assert_msg(w[i] != 101.0f, "%s: w[%d] written from a malformed reply",
				      what[mode - BAD_CODEC], i);
	}
	/* both shards malformed, shard 1 answering 0.3 s after shard 0: the
	 * pull fails with the first failure's reason, whole (a later one
	 * does not replace it, nor leak it: the sanitizer build) */
	uint32_t s0 = map.slices[0].shard == 0 ? 0 : 1;
	char want[200];
	fs[0].mode = BAD_CODEC;
	fs[1].mode = BAD_CODEC;
	fs[1].delay_ms = 300;
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	ck_assert_int_gt(q, 0);
	int rc = ps_client_wait(c, q);
	snprintf(want, sizeof(want), "shard 0 sent a malformed pull reply (slice %u)", s0);
	ck_assert_msg(rc == PS_EPROTO && strcmp(ps_client_error(c), want) == 0,
		      "both malformed: %d, '%s'; '%s' expected", rc, ps_client_error(c), want);
	fs[0].mode = ANSWER_RIGHT;
	fs[1].mode = ANSWER_RIGHT;
	fs[1].delay_ms = 0;
	pull_honest(c, w);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* An authenticated shard answers row pulls with replies that do not fit
 * what was asked: a row fewer, another dim, an unknown codec, a payload a
 * float short. Each fails the pull as malformed, naming shard 1, the rows
 * and bytes it sent and what was asked, and nothing but shard 0's rows
 * reaches the output; then an honest reply on the same connection is
 * taken, every row from the shard that holds it. */
START_TEST(test_malformed_row_pull_replies)
{
	static const char *what[] = { "", "a row fewer", "dim + 1", "codec 2", "a float short" };
	enum { NIDS = 64 };
	static float out[NIDS * ROW_DIM];
	uint64_t ids[NIDS];
	struct fake_shard fs[2];
	int from[2] = { 0, 0 };

	for (int i = 0; i < NIDS; i++)
		ids[i] = 1000003ull * (uint64_t)(i + 1);
	with_table = 1;
	fake_shards_start(fs, ANSWER_RIGHT);
	with_table = 0;
	struct ps_client *c = connect_retry();
	for (int mode = ROWS_FEWER; mode < ROWS_END; mode++) {
		fs[1].rows_mode = mode;
		for (int i = 0; i < NIDS * ROW_DIM; i++)
			out[i] = -7.0f;
		int rc = ps_client_pull_rows(c, "e", 0, ids, NIDS, out);
		ck_assert_msg(rc == PS_EPROTO, "%s: %s (%s)", what[mode], ps_strerror(rc),
			      ps_client_error(c));
		ck_assert_msg(strstr(ps_client_error(c), "shard 1 sent a malformed row pull reply ("),
			      "%s: %s", what[mode], ps_client_error(c));
		ck_assert_msg(strstr(ps_client_error(c), "of dim 4)"),
			      "%s: what was asked is not named: %s", what[mode], ps_client_error(c));
		/* shard 0's rows may be written, nothing else */
		for (int i = 0; i < NIDS * ROW_DIM; i++)
			ck_assert_msg(out[i] == -7.0f || out[i] == 100.0f,
				      "%s: out[%d] = %g, written from a malformed reply", what[mode], i,
				      (double)out[i]);
	}
	fs[1].rows_mode = ROWS_RIGHT;
	ck_assert_msg(ps_client_pull_rows(c, "e", 0, ids, NIDS, out) == 0, "%s", ps_client_error(c));
	for (int i = 0; i < NIDS; i++) {
		float v = out[i * ROW_DIM];
		ck_assert_msg(v == 100.0f || v == 101.0f, "row %d: %g", i, (double)v);
		for (int d = 1; d < ROW_DIM; d++)
			ck_assert_msg(out[i * ROW_DIM + d] == v, "row %d is not one shard's", i);
		from[v == 101.0f]++;
	}
	ck_assert_msg(from[0] > 0 && from[1] > 0, "rows from shard 0: %d, shard 1: %d", from[0],
		      from[1]);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* An authenticated shard sends a frame of a type no shard sends (a pull
 * request) before its pull reply: the client logs it by name and goes on;
 * the pull completes with the shard's values. */
START_TEST(test_unexpected_frame_logged)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct fake_shard fs[2];
	char *log;

	fake_shards_start(fs, ANSWER_AFTER_UNEXPECTED);
	struct ps_client *c = connect_retry();
	tu_capture_begin();
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	int rc = q > 0 ? ps_client_wait(c, q) : (int)q;
	log = tu_capture_end();
	ck_assert_msg(rc == 0, "%s", ps_client_error(c));
	ck_assert_msg(strstr(log, "shard 1 sent an unexpected pull frame"), "no warning: %s", log);
	ck_assert_msg(!strstr(log, "shard 0 sent an unexpected"), "%s", log);
	for (int i = 0; i < N; i++) {
		const struct ps_slice *sl = &map.slices[i < (int)map.slices[0].count ? 0 : 1];
		ck_assert_msg(w[i] == 100.0f + (float)sl->shard, "w[%d] = %g", i, (double)w[i]);
	}
	free(log);
	ps_client_free(c);
	fake_shards_stop(fs);
}
END_TEST

/* The same frames read by the waiting thread itself: with a long
 * limits.wait_spin_us the thread that waits for a pull polls the socket,
 * reads the unexpected frame before the reply and leaves it to the I/O
 * thread (a deferred frame). The I/O thread must handle it (the warning)
 * and go on serving: every pull completes, one warning each. */
static struct ps_client *spin_client;
static volatile int spin_done;
static char spin_err[300];

static void *spin_pulls(void *arg)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	int n = (int)(intptr_t)arg;

	for (int i = 0; i < n; i++) {
		int64_t q = ps_client_pull(spin_client, 0, &tw, 1);
		int rc = q > 0 ? ps_client_wait(spin_client, q) : (int)q;
		if (rc) {
			snprintf(spin_err, sizeof(spin_err), "pull %d: %s", i,
				 ps_client_error(spin_client));
			break;
		}
	}
	spin_done = 1;
	return NULL;
}

START_TEST(test_unexpected_frame_read_by_waiter)
{
	enum { PULLS = 20 };
	struct fake_shard fs[2];
	pthread_t th;
	char *log;

	fake_shards_start(fs, ANSWER_AFTER_UNEXPECTED);
	cfg.limits.wait_spin_us = 100000; /* the waiting thread reads what comes */
	spin_client = connect_retry();
	spin_done = 0;
	spin_err[0] = 0;
	tu_capture_begin();
	ck_assert_int_eq(pthread_create(&th, NULL, spin_pulls, (void *)(intptr_t)PULLS), 0);
	double deadline = now_ms() + 10000 * tu_time_scale();
	while (!spin_done && now_ms() < deadline)
		tu_sleep_ms(10);
	if (!spin_done) {
		log = tu_capture_end();
		ck_abort_msg("%d pulls not done within 10 s: the I/O thread stuck on a frame the "
			     "waiting thread left to it? %s", PULLS, log);
	}
	pthread_join(th, NULL);
	ps_client_free(spin_client); /* handles what is still deferred */
	log = tu_capture_end();
	ck_assert_msg(!spin_err[0], "%s", spin_err);
	int warned = 0;
	for (const char *p = log; (p = strstr(p, "shard 1 sent an unexpected pull frame")); p++)
		warned++;
	ck_assert_msg(warned == PULLS, "%d warnings for %d unexpected frames: %s", warned, PULLS,
		      log);
	ck_assert_int_eq(fs[1].pulls, PULLS);
	free(log);
	fake_shards_stop(fs);
}
END_TEST

/* A push refused by a stopping shard (PS_ERESHARD) is sent again by the
 * tick 0.5 s later, or by the reconnect: when the connection broke in
 * between and the new one is still in its handshake at that tick, the
 * push waits for the handshake. This fake refuses the push, closes, and
 * on the reconnect waits 1.2 s before it reads anything: the first frame
 * must be the Hello, the push only after the handshake (acknowledged). */
static int stop_port, stop_lfd;

static void *stop_then_slow_shard(void *arg)
{
	struct fake fk = { .fd = fake_accept(stop_lfd, 10000) };
	ProtobufCMessage *m = NULL;

	(void)arg;
	ck_assert_msg(fk.fd >= 0, "the client did not connect");
	fake_handshake(&fk, 0);
	ck_assert_int_eq(fake_recv(&fk, &m, NULL, NULL, 10000), PS_MSG_PUSH);
	Ps__Error e = PS__ERROR__INIT;
	e.req_id = ((Ps__Push *)m)->req_id;
	e.code = PS_ERESHARD;
	e.message = "stopping for a re-shard at clock 0";
	protobuf_c_message_free_unpacked(m, NULL);
	ck_assert_int_eq(fake_send(&fk, PS_MSG_ERROR, &e.base, NULL, 0), 0);
	close(fk.fd);
	/* the reconnect (0.1 s later): no answer to its Hello until past the
	 * tick that sends the refused push again */
	struct fake fk2 = { .fd = fake_accept(stop_lfd, 10000) };
	ck_assert_msg(fk2.fd >= 0, "the client did not reconnect");
	tu_sleep_ms(1200);
	fake_handshake(&fk2, 0); /* asserts the first frame is the Hello, the next the Auth */
	ck_assert_int_eq(fake_recv(&fk2, &m, NULL, NULL, 10000), PS_MSG_PUSH);
	Ps__PushAck ack = PS__PUSH_ACK__INIT;
	ack.req_id = ((Ps__Push *)m)->req_id;
	protobuf_c_message_free_unpacked(m, NULL);
	ck_assert_int_eq(fake_send(&fk2, PS_MSG_PUSH_ACK, &ack.base, NULL, 0), 0);
	tu_sleep_ms(200); /* the ack read before the close */
	close(fk2.fd);
	return NULL;
}

START_TEST(test_stop_refused_push_waits_for_handshake)
{
	static float g[N];
	struct ps_tensor tg = { .name = "a", .data = g, .count = N };
	pthread_t th;

	stop_port = tu_free_port();
	write_cfg(1, &stop_port);
	stop_lfd = fake_listen(stop_port);
	ck_assert_int_eq(pthread_create(&th, NULL, stop_then_slow_shard, NULL), 0);
	struct ps_client *c = connect_retry();
	for (int i = 0; i < N; i++)
		g[i] = 1.0f;
	int64_t p = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(p, 0);
	int rc = ps_client_wait(c, p);
	ck_assert_msg(rc == 0, "the push: %s", ps_client_error(c));
	pthread_join(th, NULL);
	ps_client_free(c);
	close(stop_lfd);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

/* ---- limits and paces of the client's side, measured at the shard ---- */

/* A shard that counts what reaches it: after the handshake it records the
 * arrival of each join step (StatsRequest HOLD) and refuses the first
 * `refusals` as a shard with a re-shard stop pending does (member_status
 * PS_ERESHARD), then says the worker is a member (refusals < 0: refuses
 * every one); it records each heartbeat and, while `echo` is set, answers
 * it as a shard does; it records when the client closes the connection. */
#define PACE_MAX 64
struct pacer {
	int lfd;
	volatile int refusals, echo, stop;
	pthread_t th;
	double hold_at[PACE_MAX], hb_at[PACE_MAX];
	volatile int nhold, nhb;
	volatile double last_tx, closed_at; /* ps_now_s() */
};

static const char pace_why[] = "a re-shard is in progress: this shard stops at clock 3 (prepared); "
			       "worker 0 joins after it";

static void *pacer_main(void *arg)
{
	struct pacer *pc = arg;
	struct fake fk;

	if (fake_serve_start(&fk, pc->lfd, 0, &pc->stop))
		return NULL;
	pc->last_tx = ps_now_s();
	while (!pc->stop) {
		ProtobufCMessage *m;
		int type = fake_next(&fk, &m);
		double at = ps_now_s();
		if (!type)
			continue;
		if (type < 0) {
			pc->closed_at = at;
			break;
		}
		if (type == PS_MSG_HEARTBEAT && pc->nhb < PACE_MAX) {
			pc->hb_at[pc->nhb++] = at;
			if (pc->echo) {
				Ps__Heartbeat hb = PS__HEARTBEAT__INIT;
				hb.seq = ((Ps__Heartbeat *)m)->seq;
				ck_assert_int_eq(fake_send(&fk, PS_MSG_HEARTBEAT, &hb.base, NULL, 0), 0);
				pc->last_tx = ps_now_s();
			}
		}
		if (type == PS_MSG_STATS_REQUEST &&
		    ((Ps__StatsRequest *)m)->member_op == PS__MEMBER_OP__MEMBER_HOLD) {
			Ps__Stats st = PS__STATS__INIT;
			int n = pc->nhold;
			if (n < PACE_MAX)
				pc->hold_at[pc->nhold++] = at;
			st.req_id = ((Ps__StatsRequest *)m)->req_id;
			if (pc->refusals < 0 || n < pc->refusals) {
				st.member_status = PS_ERESHARD;
				st.member_error = (char *)pace_why;
			} else {
				st.member_status = 1; /* a member from clock 0 */
			}
			ck_assert_int_eq(fake_send(&fk, PS_MSG_STATS, &st.base, NULL, 0), 0);
			pc->last_tx = ps_now_s();
		}
		protobuf_c_message_free_unpacked(m, NULL);
	}
	close(fk.fd);
	return NULL;
}

static void pacer_start(struct pacer *pc, int refusals, int echo)
{
	int port = tu_free_port();

	write_cfg(1, &port);
	*pc = (struct pacer){ .lfd = fake_listen(port), .refusals = refusals, .echo = echo };
	ck_assert_int_eq(pthread_create(&pc->th, NULL, pacer_main, pc), 0);
}

static void pacer_stop(struct pacer *pc)
{
	pc->stop = 1;
	pthread_join(pc->th, NULL);
	close(pc->lfd);
	ps_shardmap_free(&map);
	unlink(path);
}

/* The smallest and the middle of the n - 1 gaps between the times t. */
static void gaps(const double *t, int n, double *min, double *mid)
{
	double g[PACE_MAX];

	for (int i = 1; i < n; i++) {
		double x = t[i] - t[i - 1];
		int j = i - 1;
		while (j > 0 && g[j - 1] > x) {
			g[j] = g[j - 1];
			j--;
		}
		g[j] = x;
	}
	*min = n > 1 ? g[0] : 0;
	*mid = n > 1 ? g[(n - 1) / 2] : 0;
}

/* A join refused while a re-shard's stop is pending is asked again every
 * 0.2 s (ps_client_members.c): counted where the requests arrive, each
 * gap is at least 0.2 s (a sleep never ends early, whatever the load) and
 * the middle one under 0.6 s; the wait is logged once, whole. Refused on
 * and on, the join gives up once limits.reconnect_timeout_ms (1.5 s) has
 * passed since the first refusal: after at least 1.5 s, at most 1.5 / 0.2
 * + 2 requests, with the code and the whole reason. */
START_TEST(test_join_waits_paced)
{
	struct pacer pc;
	char want[400];

	pacer_start(&pc, 3, 0);
	cfg.limits.reconnect_timeout_ms = 1500;
	struct ps_client *c = connect_retry();
	tu_capture_begin();
	int rc = ps_client_join(c);
	char *log = tu_capture_end();
	ck_assert_msg(rc == 0, "join: %s", ps_client_error(c));
	ck_assert_int_eq(pc.nhold, 4);
	double min, mid;
	gaps(pc.hold_at, pc.nhold, &min, &mid);
	ck_assert_msg(min >= 0.2 - 0.005 && mid < 0.6 * tu_time_scale(), "join steps asked again "
		      "after %.3f s (the shortest) and %.3f s (the middle), 0.2 s due", min, mid);
	snprintf(want, sizeof(want), "worker 0: the join waits: shard 0: %s\n", pace_why);
	const char *p = strstr(log, want);
	ck_assert_msg(p && !strstr(p + strlen(want), "the join waits"), "the wait logged not once, "
		      "whole: %s", log);
	free(log);

	/* refused on and on: given up */
	pc.refusals = -1;
	pc.nhold = 0;
	double t0 = ps_now_s();
	rc = ps_client_join(c);
	double took = ps_now_s() - t0;
	snprintf(want, sizeof(want), "join refused by shard 0: %s", pace_why);
	ck_assert_msg(rc == PS_ERESHARD && strcmp(ps_client_error(c), want) == 0,
		      "%d (%s): '%s', '%s' expected", rc, ps_strerror(rc), ps_client_error(c), want);
	ck_assert_msg(took >= 1.5 && took < 6.0 * tu_time_scale(), "given up after %.2f s, "
		      "limits.reconnect_timeout_ms is 1.5 s", took);
	ck_assert_msg(pc.nhold >= 2 && pc.nhold <= 9, "%d join steps in %.2f s", pc.nhold, took);
	gaps(pc.hold_at, pc.nhold, &min, &mid);
	ck_assert_msg(min >= 0.2 - 0.005, "asked again after %.3f s", min);
	ps_client_free(c);
	pacer_stop(&pc);
}
END_TEST

/* ---- scripted membership answers (ps_client_members.c) ---- */

/* A fake shard that answers each join and leave step as its script says:
 * a hold (status 1: a member from `clock`; 0: held at `clock`; < 0:
 * refused with `why`), a join, a freeze; and records the clock each join
 * asked for. */
struct member_fake {
	int lfd, shard;
	volatile int stop;
	pthread_t th;
	int hold_status, join_status, freeze_status;
	uint64_t hold_clock, freeze_clock;
	const char *why;
	volatile int njoin, nfreeze;
	volatile uint64_t join_clock;
};

static void *member_fake_main(void *arg)
{
	struct member_fake *mf = arg;
	struct fake fk;

	if (fake_serve_start(&fk, mf->lfd, mf->shard, &mf->stop))
		return NULL;
	while (!mf->stop) {
		ProtobufCMessage *m;
		int type = fake_next(&fk, &m);
		if (!type)
			continue;
		if (type < 0)
			break;
		if (type == PS_MSG_STATS_REQUEST) {
			Ps__StatsRequest *q = (Ps__StatsRequest *)m;
			Ps__Stats st = PS__STATS__INIT;
			st.req_id = q->req_id;
			switch (q->member_op) {
			case PS__MEMBER_OP__MEMBER_HOLD:
				st.member_status = mf->hold_status;
				st.member_clock = mf->hold_clock;
				break;
			case PS__MEMBER_OP__MEMBER_JOIN:
				mf->join_clock = q->member_clock;
				mf->njoin++;
				st.member_status = mf->join_status;
				st.member_clock = q->member_clock;
				break;
			case PS__MEMBER_OP__MEMBER_FREEZE:
				mf->nfreeze++;
				st.member_status = mf->freeze_status;
				st.member_clock = mf->freeze_clock;
				break;
			default:
				break;
			}
			if (st.member_status < 0)
				st.member_error = (char *)mf->why;
			ck_assert_int_eq(fake_send(&fk, PS_MSG_STATS, &st.base, NULL, 0), 0);
		}
		protobuf_c_message_free_unpacked(m, NULL);
	}
	close(fk.fd);
	return NULL;
}

/* Two scripted shards (their scripts set in mf before), and the client. */
static struct ps_client *member_fakes_start(struct member_fake mf[2], int async)
{
	int ports[2] = { tu_free_port(), tu_free_port() };

	while (ports[1] == ports[0])
		ports[1] = tu_free_port();
	write_cfg(2, ports);
	if (async) {
		cfg.consistency = PS_ASYNC;
		cfg.staleness = 2;
	}
	for (int k = 0; k < 2; k++) {
		mf[k].shard = k;
		mf[k].lfd = fake_listen(ports[k]);
		ck_assert_int_eq(pthread_create(&mf[k].th, NULL, member_fake_main, &mf[k]), 0);
	}
	return connect_retry();
}

static void member_fakes_stop(struct member_fake mf[2], struct ps_client *c)
{
	ps_client_free(c);
	for (int k = 0; k < 2; k++) {
		mf[k].stop = 1;
		pthread_join(mf[k].th, NULL);
		close(mf[k].lfd);
	}
	ps_shardmap_free(&map);
	unlink(path);
}

/* A join's answers that do not fit together, and refusals, each given up
 * with the code and the whole reason; a join that fits asks both shards
 * for the clock after the highest held one, and a worker a member of both
 * already goes on from the clock they count it from. */
START_TEST(test_join_answers_checked)
{
	struct member_fake mf[2];
	struct ps_client *c;
	char want[300];
	int rc;

	/* members from two clocks */
	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .hold_status = 1, .hold_clock = 3 };
	mf[1] = (struct member_fake){ .hold_status = 1, .hold_clock = 5 };
	c = member_fakes_start(mf, 0);
	rc = ps_client_join(c);
	ck_assert_msg(rc == PS_EREFUSED && !strcmp(ps_client_error(c), "cannot join: shards 0 "
		      "and 1 count worker 0 from clocks 3 and 5"), "%d: '%s'", rc,
		      ps_client_error(c));
	ck_assert_int_eq(mf[0].njoin + mf[1].njoin, 0);
	member_fakes_stop(mf, c);

	/* a member of shard 0 from 3, shard 1 held past it at 7 */
	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .hold_status = 1, .hold_clock = 3 };
	mf[1] = (struct member_fake){ .hold_status = 0, .hold_clock = 7 };
	c = member_fakes_start(mf, 0);
	rc = ps_client_join(c);
	ck_assert_msg(rc == PS_EREFUSED && !strcmp(ps_client_error(c), "cannot join: shard 0 "
		      "counts worker 0 from clock 3, another shard has passed that clock (it is at "
		      "7): restart that shard, or wait for its drop timeout"), "%d: '%s'", rc,
		      ps_client_error(c));
	member_fakes_stop(mf, c);

	/* held at 2 and 4: the join asks both for 5; shard 1 refuses it */
	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .hold_clock = 2 };
	mf[1] = (struct member_fake){ .hold_clock = 4, .join_status = PS_EREFUSED,
				      .why = "only a worker may join or leave" };
	c = member_fakes_start(mf, 0);
	rc = ps_client_join(c);
	ck_assert_msg(rc == PS_EREFUSED && !strcmp(ps_client_error(c), "join at clock 5 refused "
		      "by shard 1: only a worker may join or leave"), "%d: '%s'", rc,
		      ps_client_error(c));
	ck_assert_msg(mf[0].njoin == 1 && mf[0].join_clock == 5 && mf[1].njoin == 1 &&
		      mf[1].join_clock == 5, "joins asked: shard 0 %d at %llu, shard 1 %d at %llu; "
		      "one each at 5 due", mf[0].njoin, (unsigned long long)mf[0].join_clock,
		      mf[1].njoin, (unsigned long long)mf[1].join_clock);
	member_fakes_stop(mf, c);

	/* a hold refused (not for a re-shard): given up at once */
	memset(mf, 0, sizeof(mf));
	mf[1] = (struct member_fake){ .hold_status = PS_EPROTO, .why = "worker 0: a join at "
				      "clock 9: out of range" };
	c = member_fakes_start(mf, 0);
	rc = ps_client_join(c);
	snprintf(want, sizeof(want), "join refused by shard 1: %s", mf[1].why);
	ck_assert_msg(rc == PS_EPROTO && !strcmp(ps_client_error(c), want), "%d: '%s'", rc,
		      ps_client_error(c));
	member_fakes_stop(mf, c);

	/* a member of both from 6: no join asked, the worker goes on from 6 */
	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .hold_status = 1, .hold_clock = 6 };
	mf[1] = (struct member_fake){ .hold_status = 1, .hold_clock = 6 };
	c = member_fakes_start(mf, 0);
	rc = ps_client_join(c);
	ck_assert_msg(rc == 0, "join: %s", ps_client_error(c));
	ck_assert_int_eq(mf[0].njoin + mf[1].njoin, 0);
	ck_assert_uint_eq(ps_client_clock(c), 6);
	member_fakes_stop(mf, c);
}
END_TEST

/* A leave in async mode with staleness freezes the worker on every shard
 * in two rounds and trains up to the highest clock a shard answers; a
 * freeze refused gives the leave up with the code and the whole reason. */
START_TEST(test_leave_answers_checked)
{
	struct member_fake mf[2];
	struct ps_client *c;
	uint64_t last = 0;
	int rc;

	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .freeze_status = 1, .freeze_clock = 4 };
	mf[1] = (struct member_fake){ .freeze_status = 1, .freeze_clock = 6 };
	c = member_fakes_start(mf, 1);
	rc = ps_client_leave_begin(c, &last);
	ck_assert_msg(rc == 0, "leave: %s", ps_client_error(c));
	ck_assert_uint_eq(last, 6);
	ck_assert_msg(mf[0].nfreeze == 2 && mf[1].nfreeze == 2, "freezes asked: %d and %d, two "
		      "rounds due", mf[0].nfreeze, mf[1].nfreeze);
	member_fakes_stop(mf, c);

	memset(mf, 0, sizeof(mf));
	mf[0] = (struct member_fake){ .freeze_status = 1, .freeze_clock = 4 };
	mf[1] = (struct member_fake){ .freeze_status = PS_EREFUSED,
				      .why = "worker 0 is not a member: it has nothing to leave" };
	c = member_fakes_start(mf, 1);
	rc = ps_client_leave_begin(c, &last);
	ck_assert_msg(rc == PS_EREFUSED && !strcmp(ps_client_error(c), "leave refused by shard 1: "
		      "worker 0 is not a member: it has nothing to leave"), "%d: '%s'", rc,
		      ps_client_error(c));
	member_fakes_stop(mf, c);
}
END_TEST

/* limits.idle_timeout_ms (900 ms here) from both sides. A shard that
 * answers each heartbeat keeps the connection for twice the limit, the
 * heartbeats coming at least a third of it apart; once it stops
 * answering, the client closes the connection no sooner than the limit
 * after the last frame it got, and the pull waiting there fails with the
 * code and the whole reason. */
START_TEST(test_idle_limit)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct pacer pc;
	char want[300];

	pacer_start(&pc, 0, 1);
	cfg.limits.idle_timeout_ms = 900;
	cfg.limits.reconnect_timeout_ms = 0; /* a closed connection fails its requests */
	struct ps_client *c = connect_retry();
	tu_sleep_ms(1800);
	ck_assert_msg(pc.closed_at == 0, "closed while the shard answered every heartbeat");
	ck_assert_msg(pc.nhb >= 2, "%d heartbeats in 1.8 s, one each 0.3 s due", pc.nhb);
	double min, mid;
	gaps(pc.hb_at, pc.nhb, &min, &mid);
	ck_assert_msg(min >= 0.3 - 0.02, "heartbeats %.3f s apart, a third of the idle limit "
		      "(0.3 s) due", min);
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	ck_assert_int_gt(q, 0);
	pc.echo = 0; /* silent from now on: the pull is not answered either */
	double t0 = ps_now_s();
	int rc = ps_client_wait(c, q);
	double took = ps_now_s() - t0;
	snprintf(want, sizeof(want), "shard 0 (127.0.0.1:%d): nothing received for 900 ms "
		 "(limits.idle_timeout_ms)", cfg.shards[0].port);
	ck_assert_msg(rc == PS_ETIMEDOUT && strcmp(ps_client_error(c), want) == 0,
		      "%d (%s): '%s', '%s' expected", rc, ps_strerror(rc), ps_client_error(c), want);
	double deadline = now_ms() + 5000 * tu_time_scale();
	while (pc.closed_at == 0 && now_ms() < deadline)
		tu_sleep_ms(10);
	ck_assert_msg(pc.closed_at - pc.last_tx >= 0.9 - 0.005, "closed %.3f s after the "
		      "shard's last frame: before the idle limit", pc.closed_at - pc.last_tx);
	ck_assert_msg(took < 5.0 * tu_time_scale(), "the pull failed after %.2f s", took);
	ps_client_free(c);
	pacer_stop(&pc);
}
END_TEST

/* limits.reconnect_timeout_ms (1 s) from the side test_reconnect_gives_up
 * does not take: a shard killed and back (a fake on its port) 0.5 s later
 * is reconnected within the window; the pull sent there is answered. */
START_TEST(test_reconnect_within_window)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct fake_shard fs = { .shard = 0, .mode = ANSWER_RIGHT };
	int port = tu_free_port();
	pid_t pid;

	write_cfg(1, &port);
	pid = tu_start_server(path, 0);
	cfg.limits.reconnect_timeout_ms = 1000;
	cfg.limits.connect_timeout_ms = 400;
	struct ps_client *c = connect_retry();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	tu_sleep_ms(500);
	fs.port = port;
	fs.lfd = fake_listen(port);
	ck_assert_int_eq(pthread_create(&fs.th, NULL, fake_shard_main, &fs), 0);
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	ck_assert_int_gt(q, 0);
	ck_assert_msg(ps_client_wait(c, q) == 0, "the shard back within the window: %s",
		      ps_client_error(c));
	for (int i = 0; i < N; i++)
		ck_assert_msg(w[i] == 100.0f, "w[%d] = %g", i, (double)w[i]);
	ps_client_free(c);
	fs.stop = 1;
	pthread_join(fs.th, NULL);
	close(fs.lfd);
	ps_shardmap_free(&map);
	unlink(path);
}
END_TEST

static volatile int freed;

static void *free_main(void *arg)
{
	ps_client_free(arg);
	freed = 1;
	return NULL;
}

/* A client freed while a pull waits for a shard that never answers:
 * ps_client_free returns (within 5 s) and releases the pending request
 * (the sanitizer build would see a leak). */
START_TEST(test_free_with_pull_pending)
{
	static float w[N];
	struct ps_tensor tw = { .name = "a", .data = w, .count = N };
	struct fake_shard fs[2];
	pthread_t th;

	fake_shards_start(fs, ANSWER_NEVER);
	struct ps_client *c = connect_retry();
	int64_t q = ps_client_pull(c, 0, &tw, 1);
	ck_assert_int_gt(q, 0);
	double deadline = now_ms() + 5000 * tu_time_scale();
	while ((fs[0].pulls < 1 || fs[1].held < 1) && now_ms() < deadline)
		tu_sleep_ms(10);
	ck_assert_msg(fs[0].pulls == 1 && fs[1].held == 1, "the pull did not reach both shards");
	ck_assert_int_eq(pthread_create(&th, NULL, free_main, c), 0);
	deadline = now_ms() + 5000 * tu_time_scale();
	while (!freed && now_ms() < deadline)
		tu_sleep_ms(10);
	ck_assert_msg(freed, "ps_client_free did not return within 5 s with a pull pending");
	pthread_join(th, NULL);
	fake_shards_stop(fs);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fake_shard");
	TCase *tc = tcase_create("liars");
	int failed;

	tu_secret_setup();
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 60);
	TU_ADD(tc, test_replies_before_handshake_ignored);
	TU_ADD(tc, test_reconnect_nothing_pending);
	TU_ADD(tc, test_stranger_cannot_stop_retries);
	TU_ADD(tc, test_client_survives_reset_under_write);
	TU_ADD(tc, test_fake_shards_answer_right);
	TU_ADD(tc, test_foreign_slice_refused);
	TU_ADD(tc, test_malformed_pull_replies);
	TU_ADD(tc, test_pull_reply_to_push_ignored);
	TU_ADD(tc, test_members_not_turned_back);
	TU_ADD(tc, test_malformed_row_pull_replies);
	TU_ADD(tc, test_bad_challenges_refused);
	TU_ADD(tc, test_unexpected_frame_logged);
	TU_ADD(tc, test_unexpected_frame_read_by_waiter);
	TU_ADD(tc, test_stop_refused_push_waits_for_handshake);
	TU_ADD(tc, test_free_with_pull_pending);
	TU_ADD(tc, test_join_waits_paced);
	TU_ADD(tc, test_join_answers_checked);
	TU_ADD(tc, test_leave_answers_checked);
	TU_ADD(tc, test_idle_limit);
	TU_ADD(tc, test_reconnect_within_window);
	TU_ADD_LOOP(tc, test_reconnect_gives_up, 0, 3);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
