/* it_replica_auth.c - who a replicated shard's process believes
 * (docs/security.md, "The replication link"): real ps-server processes
 * (cluster.replicas: 1, one shard) and a test process that plays the
 * partner, over raw sockets.
 *
 *  - An impostor without the replication key listens at the partner's
 *    address while the partner is down and answers the dialing process
 *    with a HelloReply (a primary's, then a joining process's refusal)
 *    and a whole snapshot; one holding only the cluster secret answers
 *    with a challenge proven with that secret. Nothing is believed: the
 *    dialer closes without acknowledging, stays joining at epoch 0, and
 *    the real partner, started afterwards, forms the pair and serves the
 *    initial weights.
 *  - A peer holding the cluster secret (every worker does) sends a
 *    replica Hello to the primary (claiming a later epoch) and to the
 *    backup (claiming the primary restarted): the shard's challenge is
 *    not provable with the secret, the proof is refused, nobody steps
 *    down or takes over. A worker's authenticated connection that sends
 *    replication frames is closed.
 *  - A partner that does hold the replication key is believed (control)
 *    but its snapshot and batch contents are range-checked: versions past
 *    2^53 and NaN weights or gradients close the link, and nothing of
 *    them is applied. With security.mac: false the link is MACed all the
 *    same: a frame in clear after the handshake is not believed.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include "auth.h"
#include "ckpt_format.h"
#include "config.h"
#include "config_agree.h"
#include "dedup.h"
#include "frame_mac.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "test_util.h"

static char cfg_path[64], logdir[64];
static struct ps_config cfg;
static const char *model_extra = ""; /* lines setup adds to the model section */
static struct ps_shardmap map;
static int port[2];
static pid_t srv[2];
static uint8_t secret[PS_AUTH_KEY_LEN], repl_key[PS_AUTH_KEY_LEN];

static double now_ms(void)
{
	return ps_now_s() * 1e3;
}

/* A free port below the ephemeral range (the processes dial each other
 * from ephemeral ports; a port the test listens on, then frees for a
 * real process, must not be taken meanwhile by such a dial). */
static int low_port(int avoid)
{
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)avoid;

	for (int i = 0; i < 1000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000);
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

		ok = p != avoid && fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (fd >= 0)
			close(fd);
		if (ok)
			return p;
	}
	return tu_free_port();
}

static void setup(int timeout_ms, const char *extra)
{
	char yaml[1024], err[512], path[1100];

	port[0] = low_port(0);
	port[1] = low_port(port[0]);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d]\n  backups: [127.0.0.1:%d]\n"
		 "  replicas: 1\n  workers: 1\n"
		 "replication:\n  timeout_ms: %d\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "limits:\n  connect_timeout_ms: 10000\n  reconnect_timeout_ms: 30000\n"
		 "%s"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000]}\n%s",
		 port[0], port[1], timeout_ms, extra, model_extra);
	ck_assert_int_eq(tu_write_temp(cfg_path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, cfg_path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_shardmap_init(&map, &cfg), 0);
	ck_assert_msg(ps_auth_load_secret(&cfg, secret, err, sizeof(err)) == 0, "%s", err);
	ps_auth_repl_key_path(&cfg, path, sizeof(path));
	ck_assert_msg(path[0], "PS_REPL_KEY_FILE is not set");
	ck_assert_msg(ps_auth_load_repl_key_file(path, secret, repl_key, err, sizeof(err)) == 0,
		      "%s", err);
	strcpy(logdir, "/tmp/ps-test-replauth-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
}

static const char *start_cfg; /* another config for start_replica, when set */

static pid_t start_replica(int r)
{
	const char *path = start_cfg ? start_cfg : cfg_path;
	char log[128];
	pid_t pid;

	snprintf(log, sizeof(log), "%s/r%d.log", logdir, r);
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execl("bin/ps-server", "ps-server", "--config", path, "--shard", "0", "--replica",
		      r ? "1" : "0", "--log-level", "info", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void teardown(void)
{
	for (int r = 0; r < 2; r++)
		if (srv[r] > 0) {
			int st = tu_stop_server(srv[r]);
			ck_assert_msg(st == 0, "replica %d exited with %d (logs in %s)", r, st, logdir);
			srv[r] = 0;
		}
	ps_shardmap_free(&map);
	unlink(cfg_path);
}

/* How many times text is in replica r's log. */
static int log_count(int r, const char *text)
{
	char path[160];

	snprintf(path, sizeof(path), "%s/r%d.log", logdir, r);
	return tu_file_count(path, text);
}

static int log_has(int r, const char *text)
{
	return log_count(r, text) > 0;
}

/* Stats of replica r, as a monitor with the cluster secret. */
static int stats_of(int r, struct ps_shard_stats *out)
{
	struct ps_config *c = malloc(sizeof(*c));
	struct ps_client *cl = NULL;
	char err[512];
	int rc;

	memcpy(c, &cfg, sizeof(*c));
	if (r)
		memcpy(c->shards, c->backups, sizeof(c->shards));
	c->limits.connect_timeout_ms = 1000;
	c->limits.request_timeout_ms = 2000;
	rc = ps_client_init(&cl, c, -1, err, sizeof(err));
	if (!rc) {
		rc = ps_client_stats(cl, 0, out);
		ps_client_free(cl);
	}
	free(c);
	return rc;
}

static struct ps_shard_stats stats_ok(int r)
{
	struct ps_shard_stats st;
	double t0 = now_ms();
	int rc;

	while ((rc = stats_of(r, &st)) && now_ms() - t0 < 10000 * tu_time_scale())
		tu_sleep_ms(50);
	ck_assert_msg(rc == 0, "no stats from replica %d: %s (logs in %s)", r, ps_strerror(rc),
		      logdir);
	return st;
}

/* Waits until one replica is the primary with its backup caught up; which. */
static int wait_pair(void)
{
	double t0 = now_ms();

	while (now_ms() - t0 < 20000 * tu_time_scale()) {
		struct ps_shard_stats a, b;
		if (!stats_of(0, &a) && !stats_of(1, &b)) {
			if (a.repl_state == 3 && a.repl_partner_up && b.repl_state == 2)
				return 0;
			if (b.repl_state == 3 && b.repl_partner_up && a.repl_state == 2)
				return 1;
		}
		tu_sleep_ms(50);
	}
	ck_abort_msg("the pair did not form (logs in %s)", logdir);
	return -1;
}

/* ---- a raw peer, either end ---- */

struct peer {
	int fd;
	int keyed;
	struct ps_frame_keys keys;
	uint64_t sseq, rseq;
	uint8_t hello[2048];
	size_t hello_len;
};

static int write_all(int fd, const void *b, size_t n)
{
	const uint8_t *p = b;

	while (n) {
		ssize_t k = write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -errno;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* A frame of already packed metadata and a payload; MACed once keyed. */
static int send_raw(struct peer *p, uint8_t type, const void *meta, size_t mlen,
		    const void *payload, uint64_t plen)
{
	uint8_t *b = malloc(PS_WIRE_HDR_LEN + mlen + plen + PS_MAC_TAG_LEN);
	struct ps_frame_hdr fh = { .type = type, .meta_len = (uint32_t)mlen, .payload_len = plen };
	size_t len = PS_WIRE_HDR_LEN + mlen + plen;
	int rc;

	if (p->keyed) {
		fh.flags |= PS_FRAME_F_MAC;
		fh.seq = (uint32_t)p->sseq;
	}
	ps_wire_encode_hdr(b, &fh);
	if (mlen)
		memcpy(b + PS_WIRE_HDR_LEN, meta, mlen);
	if (plen)
		memcpy(b + PS_WIRE_HDR_LEN + mlen, payload, plen);
	if (p->keyed) {
		struct ps_mac m;
		ck_assert_int_eq(ps_mac_init(&m), 0);
		ps_mac_begin(&m, p->keys.send, p->sseq++);
		ps_mac_update(&m, b, len);
		ps_mac_end(&m, b + len);
		ps_mac_free(&m);
		len += PS_MAC_TAG_LEN;
	}
	rc = write_all(p->fd, b, len);
	free(b);
	return rc;
}

static int send_msg(struct peer *p, uint8_t type, const ProtobufCMessage *m, const void *payload,
		    uint64_t plen)
{
	size_t mlen = protobuf_c_message_get_packed_size(m);
	uint8_t *meta = malloc(mlen + 1);
	int rc;

	protobuf_c_message_pack(m, meta);
	rc = send_raw(p, type, meta, mlen, payload, plen);
	free(meta);
	return rc;
}

static int read_n(int fd, void *b, size_t n, double deadline)
{
	uint8_t *q = b;

	while (n) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		int left = (int)(deadline - now_ms());
		if (left <= 0 || poll(&pfd, 1, left) == 0)
			return -ETIMEDOUT;
		ssize_t k = read(fd, q, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return PS_ECLOSED;
		q += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The next frame (its metadata unpacked; a MAC checked once keyed; the
 * raw metadata kept in p->hello for a Hello); NULL with *rc PS_ECLOSED or
 * -ETIMEDOUT. */
static ProtobufCMessage *recv_msg(struct peer *p, int ms, unsigned *type, int *rc)
{
	double deadline = now_ms() + ms * tu_time_scale();
	uint8_t h[PS_WIRE_HDR_LEN], *body;
	struct ps_wire_limits lim = { .max_frame = 1 << 24, .max_meta = 1 << 20 };
	struct ps_frame f = { 0 };
	char why[200];
	ProtobufCMessage *m;

	if ((*rc = read_n(p->fd, h, sizeof(h), deadline)))
		return NULL;
	ck_assert_int_eq(ps_wire_decode_hdr(h, &lim, &f.hdr, why, sizeof(why)), 0);
	body = malloc(f.hdr.meta_len + f.hdr.payload_len + PS_MAC_TAG_LEN + 1);
	ck_assert_int_eq(read_n(p->fd, body, f.hdr.meta_len + f.hdr.payload_len, deadline), 0);
	if (p->keyed) {
		struct ps_mac mac;
		uint8_t *tag = body + f.hdr.meta_len + f.hdr.payload_len;
		ck_assert_msg(f.hdr.flags & PS_FRAME_F_MAC, "a %s frame without a MAC",
			      ps_wire_type_name(f.hdr.type));
		ck_assert_int_eq(read_n(p->fd, tag, PS_MAC_TAG_LEN, deadline), 0);
		ck_assert_int_eq(ps_mac_init(&mac), 0);
		ps_mac_begin(&mac, p->keys.recv, p->rseq++);
		ps_mac_update(&mac, h, sizeof(h));
		ps_mac_update(&mac, body, f.hdr.meta_len + f.hdr.payload_len);
		ck_assert_msg(ps_mac_verify(&mac, tag) == 0, "the %s frame fails its MAC",
			      ps_wire_type_name(f.hdr.type));
		ps_mac_free(&mac);
	}
	if (f.hdr.type == PS_MSG_HELLO) {
		ck_assert_uint_le(f.hdr.meta_len, sizeof(p->hello));
		memcpy(p->hello, body, f.hdr.meta_len);
		p->hello_len = f.hdr.meta_len;
	}
	*type = f.hdr.type;
	f.meta = body;
	m = ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_msg(m != NULL, "%s", why);
	free(body);
	return m;
}

/* Reads until the other end closes: 0, or the type of the first frame it
 * sent instead (the frames are dropped), or -1 when it stays open. */
static int first_frame_before_close(struct peer *p, int ms)
{
	unsigned type;
	int rc, first = 0;

	for (;;) {
		ProtobufCMessage *m = recv_msg(p, ms, &type, &rc);
		if (!m)
			return rc == PS_ECLOSED ? first : first ? first : -1;
		protobuf_c_message_free_unpacked(m, NULL);
		if (!first)
			first = (int)type;
	}
}

static int listen_at(int prt)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)prt),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	ck_assert_int_ge(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind %d: %s", prt,
		      strerror(errno));
	ck_assert_int_eq(listen(fd, 8), 0);
	return fd;
}

/* The dialing process's next connection, its Hello read: a replica's of
 * replica `from`. */
static struct peer accept_dial(int lfd, int from)
{
	struct pollfd pfd = { lfd, POLLIN, 0 };
	struct peer p = { .fd = -1 };
	unsigned type;
	int rc;

	ck_assert_msg(poll(&pfd, 1, (int)(10000 * tu_time_scale())) == 1,
		      "replica %d did not dial (logs in %s)", from, logdir);
	p.fd = accept(lfd, NULL, NULL);
	ck_assert_int_ge(p.fd, 0);
	Ps__Hello *h = (Ps__Hello *)recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(h && type == PS_MSG_HELLO, "no Hello from the dialer");
	ck_assert_int_eq(h->role, PS__ROLE__ROLE_REPLICA);
	ck_assert_int_eq(h->replica, from);
	ck_assert_uint_eq(h->auth_nonce.len, PS_AUTH_NONCE_LEN);
	protobuf_c_message_free_unpacked(&h->base, NULL);
	return p;
}

static int send_reply_why(struct peer *p, int ok, int state, uint64_t epoch, uint64_t lsn,
			  const char *why)
{
	Ps__HelloReply m = PS__HELLO_REPLY__INIT;

	m.ok = ok;
	m.retry = !ok;
	m.error = (char *)why;
	m.protocol_version = PS_PROTOCOL_VERSION;
	m.shard = 0;
	m.shard_map_hash = map.hash;
	m.repl_state = (uint32_t)state;
	m.epoch = epoch;
	m.lsn = lsn;
	return send_msg(p, PS_MSG_HELLO_REPLY, &m.base, NULL, 0);
}

static int send_reply(struct peer *p, int ok, int state, uint64_t epoch, uint64_t lsn)
{
	return send_reply_why(p, ok, state, epoch, lsn, ok ? "" : "not serving");
}

/* A whole snapshot of shard 0 (SGD: weights only), every weight `value`,
 * every slice at version/steps `version`, the worker at clock `version`.
 * Stops early (0) when the dialer has closed. */
static int send_snapshot(struct peer *p, uint64_t epoch, uint64_t lsn, float value,
			 uint64_t version)
{
	Ps__ReplSnapshot m = PS__REPL_SNAPSHOT__INIT;
	uint64_t fin[1] = { version };
	struct ps_dedup dd[1];
	float *w = malloc(4096);

	m.lsn = lsn;
	m.epoch = epoch;
	for (uint32_t s = 0; s < map.nslices; s++) {
		if (map.slices[s].shard != 0)
			continue;
		for (int64_t i = 0; i < map.slices[s].count; i++)
			w[i] = value;
		m.slice = s;
		m.which = 0;
		m.version = version;
		m.steps = version;
		if (send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, w,
			     (uint64_t)map.slices[s].count * 4)) {
			free(w);
			return 0;
		}
	}
	free(w);
	memset(dd, 0, sizeof(dd));
	m.slice = 0;
	m.version = 0;
	m.steps = 0;
	m.last = 1;
	m.n_finished = 1;
	m.finished = fin;
	send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, dd, sizeof(dd));
	return 1;
}

/* The replica end of the handshake with key k (the replication key's
 * domain when repl, else the cluster secret's), as conn.c does it:
 * challenge, check the dialer's proof, key the link. 0 or the failure. */
static int serve_challenge(struct peer *p, const uint8_t *k, int repl)
{
	Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
	unsigned type;
	int rc;

	ps_auth_random(nonce, sizeof(nonce));
	ps_auth_transcript(p->hello, p->hello_len, nonce, t);
	if (repl)
		ps_auth_repl_proof(k, t, 1, proof);
	else
		ps_auth_proof(k, t, 1, proof);
	ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
	ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	ck_assert_int_eq(send_msg(p, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0), 0);
	Ps__Auth *a = (Ps__Auth *)recv_msg(p, 5000, &type, &rc);
	if (!a)
		return rc;
	ck_assert_uint_eq(type, PS_MSG_AUTH);
	ck_assert_msg(repl ? ps_auth_repl_proof_ok(k, t, 0, a->proof.data, a->proof.len)
			   : ps_auth_proof_ok(k, t, 0, a->proof.data, a->proof.len),
		      "the dialer's proof is wrong");
	protobuf_c_message_free_unpacked(&a->base, NULL);
	if (repl)
		ps_auth_repl_session_keys(k, t, 1, &p->keys);
	else
		ps_auth_session_keys(k, t, 1, &p->keys);
	p->keyed = 1;
	return 0;
}

/* ---- the tests ---- */

/* The shard's two processes apply the same pushes: a partner whose
 * config has another optimizer.lr is refused by the handshake, both ways
 * (each dials the other), each refusal said once in each log however
 * often it dials again, the shard's value as a digest names only the
 * refuser's value and the dialer adds its own; neither process serves
 * with the other. Started again with the shard's config, the partner
 * forms the pair. */
START_TEST(test_partner_settings_must_agree)
{
	char other[64], want[200];
	size_t n;

	setup(500, "");
	char *yaml = (char *)tu_slurp(cfg_path, &n), *lr = yaml ? strstr(yaml, "lr: 1\n") : NULL;
	ck_assert_ptr_nonnull(lr);
	memcpy(lr, "lr: 2\n", 6);
	ck_assert_int_eq(tu_write_temp(other, yaml), 0);
	free(yaml);
	srv[0] = start_replica(0);
	start_cfg = other;
	srv[1] = start_replica(1);
	start_cfg = NULL;
	double t0 = now_ms();
	for (int r = 0; r < 2; r++) {
		snprintf(want, sizeof(want), "refused this process: optimizer.lr: shard 0 has %d; the "
			 "two configs must agree; this process has %d (said once", r ? 1 : 2,
			 r ? 2 : 1);
		while (!log_has(r, want) && now_ms() - t0 < 10000 * tu_time_scale())
			tu_sleep_ms(50);
		ck_assert_msg(log_has(r, want), "replica %d's log lacks '%s' (logs in %s)", r, want,
			      logdir);
	}
	tu_sleep_ms(1500); /* 7 more dials each way */
	for (int r = 0; r < 2; r++) {
		struct ps_shard_stats st = stats_ok(r);
		ck_assert_int_eq(log_count(r, "refused this process: "), 1);
		ck_assert_int_eq(log_count(r, "refusing the shard's other process at "), 1);
		ck_assert_msg(st.repl_state == 1 && !st.repl_partner_up, "replica %d in state %d "
			      "beside a partner of another config", r, st.repl_state);
	}
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	srv[1] = start_replica(1);
	int pr = wait_pair();
	ck_assert_int_eq(stats_ok(pr).repl_state, 3);
	unlink(other);
	teardown();
}
END_TEST

/* Replica 0 alone, its partner's address held by the test. */
START_TEST(test_impostor_partner_not_believed)
{
	struct ps_shard_stats st;
	struct peer p;
	int lfd, got;

	setup(500, "");
	lfd = listen_at(port[1]);
	srv[0] = start_replica(0);

	/* 1. no key at all: a primary's HelloReply, then a whole snapshot
	 * of weights 999 at epoch 7 */
	p = accept_dial(lfd, 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 7, 100), 0);
	send_snapshot(&p, 7, 100, 999.0f, 5);
	got = first_frame_before_close(&p, 5000);
	ck_assert_msg(got == 0, "the dialer answered the impostor's snapshot with a %s frame: it "
		      "took the state of a process that proved nothing (logs in %s)",
		      got > 0 ? ps_wire_type_name((unsigned)got) : "no close", logdir);
	close(p.fd);
	st = stats_ok(0);
	ck_assert_msg(st.repl_state == 1 && st.repl_epoch == 0, "after the impostor's snapshot "
		      "replica 0 is in state %d at epoch %llu (1 and 0 expected)", st.repl_state,
		      (unsigned long long)st.repl_epoch);
	ck_assert(log_has(0, "answered before proving the replication key"));

	/* 2. no key: a joining process's refusal that loses the comparison
	 * (replica 0 wins ties): no takeover on its word */
	p = accept_dial(lfd, 0);
	ck_assert_int_eq(send_reply(&p, 0, PS__REPL_STATE__REPL_JOINING, 0, 0), 0);
	got = first_frame_before_close(&p, 5000);
	ck_assert_int_eq(got, 0);
	close(p.fd);
	st = stats_ok(0);
	ck_assert_msg(st.repl_state == 1, "an unauthenticated refusal made replica 0 %s",
		      st.repl_state == 3 ? "the primary" : "change state");
	/* and a refusal with a reason of 300 characters: the log quotes its
	 * first 159, what the line's buffer holds */
	{
		char why[301], want[200];
		memset(why, 'x', 300);
		why[300] = 0;
		p = accept_dial(lfd, 0);
		ck_assert_int_eq(send_reply_why(&p, 0, PS__REPL_STATE__REPL_JOINING, 0, 0, why), 0);
		ck_assert_int_eq(first_frame_before_close(&p, 5000), 0);
		close(p.fd);
		snprintf(want, sizeof(want), "(refused: %.159s)", why);
		ck_assert_msg(log_has(0, want), "the log does not quote the first 159 characters "
			      "of a refusal of 300 (logs in %s)", logdir);
	}

	/* 3. the cluster secret, not the replication key: the dialer refuses
	 * the challenge and proves nothing itself */
	p = accept_dial(lfd, 0);
	{
		Ps__AuthChallenge ch = PS__AUTH_CHALLENGE__INIT;
		uint8_t nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
		ps_auth_random(nonce, sizeof(nonce));
		ps_auth_transcript(p.hello, p.hello_len, nonce, t);
		ps_auth_proof(secret, t, 1, proof);
		ch.nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		ch.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
		ck_assert_int_eq(send_msg(&p, PS_MSG_AUTH_CHALLENGE, &ch.base, NULL, 0), 0);
	}
	got = first_frame_before_close(&p, 5000);
	ck_assert_msg(got == 0, "the dialer answered a challenge proven with the cluster secret "
		      "with a %s frame", got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
	close(p.fd);
	ck_assert(log_has(0, "does not hold the replication key"));

	/* the real partner: the pair forms and serves the initial weights */
	close(lfd);
	srv[1] = start_replica(1);
	wait_pair();
	st = stats_ok(0);
	ck_assert_uint_lt(st.repl_epoch, 7);
	{
		struct ps_client *c = NULL;
		char err[512];
		float *w = malloc(3000 * sizeof(float));
		struct ps_tensor t = { "a", w, 3000, 0 };
		for (int i = 0; i < 100 && ps_client_init(&c, &cfg, 0, err, sizeof(err)); i++)
			tu_sleep_ms(100);
		ck_assert_msg(c, "%s", err);
		int64_t id = ps_client_pull(c, 0, &t, 1);
		ck_assert_msg(id >= 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
		for (int64_t i = 0; i < 3000; i++)
			ck_assert_msg(w[i] == ps_init_value(&cfg, 0, i), "weight %lld is %g, the "
				      "initial value is %g", (long long)i, w[i],
				      ps_init_value(&cfg, 0, i));
		ps_client_free(c);
		free(w);
	}
	teardown();
}
END_TEST

/* A client holding only the cluster secret sends replica Hellos. */
static void forge_replica_hello(int target, int claim_replica, int state, uint64_t epoch)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port[target]),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct peer p = { .fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) };
	Ps__Hello h = PS__HELLO__INIT;
	uint8_t nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
	unsigned type;
	int rc;

	ck_assert_int_eq(connect(p.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ps_auth_random(nonce, sizeof(nonce));
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = PS__ROLE__ROLE_REPLICA;
	h.rank = -1;
	h.shard_map_hash = map.hash;
	h.shard = 0;
	h.incarnation = 99;
	h.replica = claim_replica;
	h.repl_state = (uint32_t)state;
	h.epoch = epoch;
	h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
	h.auth_mac = 1;
	p.hello_len = protobuf_c_message_get_packed_size(&h.base);
	protobuf_c_message_pack(&h.base, p.hello);
	ck_assert_int_eq(send_raw(&p, PS_MSG_HELLO, p.hello, p.hello_len, NULL, 0), 0);
	Ps__AuthChallenge *ch = (Ps__AuthChallenge *)recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(ch && type == PS_MSG_AUTH_CHALLENGE, "no challenge to a replica Hello");
	ps_auth_transcript(p.hello, p.hello_len, ch->nonce.data, t);
	/* the shard proves the replication key, not the secret every worker has */
	ck_assert_msg(!ps_auth_proof_ok(secret, t, 1, ch->proof.data, ch->proof.len),
		      "a replica Hello was challenged with a proof of the cluster secret");
	ck_assert(ps_auth_repl_proof_ok(repl_key, t, 1, ch->proof.data, ch->proof.len));
	protobuf_c_message_free_unpacked(&ch->base, NULL);
	/* the secret is all the forger has */
	ps_auth_proof(secret, t, 0, proof);
	Ps__Auth a = PS__AUTH__INIT;
	a.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	ck_assert_int_eq(send_msg(&p, PS_MSG_AUTH, &a.base, NULL, 0), 0);
	int got = first_frame_before_close(&p, 5000);
	ck_assert_msg(got == 0, "the forged replica got a %s frame",
		      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
	close(p.fd);
}

START_TEST(test_cluster_secret_cannot_pose_as_replica)
{
	struct ps_shard_stats a0, b0, a1, b1;

	setup(500, "");
	srv[0] = start_replica(0);
	srv[1] = start_replica(1);
	int pr = wait_pair(), bk = !pr;
	a0 = stats_ok(pr);
	b0 = stats_ok(bk);

	/* to the primary: "I am your partner, primary of a later epoch" */
	forge_replica_hello(pr, bk, PS__REPL_STATE__REPL_PRIMARY, a0.repl_epoch + 5);
	/* to the backup: "I am your primary, restarted" */
	forge_replica_hello(bk, pr, PS__REPL_STATE__REPL_JOINING, 0);

	a1 = stats_ok(pr);
	b1 = stats_ok(bk);
	ck_assert_msg(a1.repl_state == 3 && a1.repl_epoch == a0.repl_epoch && a1.repl_partner_up,
		      "the primary is in state %d, epoch %llu (was 3, %llu)", a1.repl_state,
		      (unsigned long long)a1.repl_epoch, (unsigned long long)a0.repl_epoch);
	ck_assert_msg(b1.repl_state == 2 && b1.repl_failovers == b0.repl_failovers,
		      "the backup is in state %d after a forged Hello (a second primary)",
		      b1.repl_state);
	ck_assert_uint_eq(a1.auth_failures, a0.auth_failures + 1);
	ck_assert_uint_eq(b1.auth_failures, b0.auth_failures + 1);

	/* a worker's connection cannot become a replication link: its
	 * replication frames close it, the primary's state unchanged */
	{
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons((uint16_t)port[pr]),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		struct peer p = { .fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) };
		Ps__Hello h = PS__HELLO__INIT;
		uint8_t nonce[PS_AUTH_NONCE_LEN], t[32], proof[PS_AUTH_PROOF_LEN];
		unsigned type;
		int rc;

		ck_assert_int_eq(connect(p.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		ps_auth_random(nonce, sizeof(nonce));
		h.protocol_version = PS_PROTOCOL_VERSION;
		h.role = PS__ROLE__ROLE_WORKER;
		h.rank = 0;
		h.shard_map_hash = map.hash;
		h.incarnation = 98;
		h.settings = tu_hello_settings(&cfg, 0, secret);
		h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		h.auth_mac = 1;
		p.hello_len = protobuf_c_message_get_packed_size(&h.base);
		protobuf_c_message_pack(&h.base, p.hello);
		ck_assert_int_eq(send_raw(&p, PS_MSG_HELLO, p.hello, p.hello_len, NULL, 0), 0);
		Ps__AuthChallenge *ch = (Ps__AuthChallenge *)recv_msg(&p, 5000, &type, &rc);
		ck_assert_ptr_nonnull(ch);
		ps_auth_transcript(p.hello, p.hello_len, ch->nonce.data, t);
		ck_assert(ps_auth_proof_ok(secret, t, 1, ch->proof.data, ch->proof.len));
		protobuf_c_message_free_unpacked(&ch->base, NULL);
		ps_auth_proof(secret, t, 0, proof);
		Ps__Auth au = PS__AUTH__INIT;
		au.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
		ck_assert_int_eq(send_msg(&p, PS_MSG_AUTH, &au.base, NULL, 0), 0);
		ps_auth_session_keys(secret, t, 0, &p.keys);
		p.keyed = 1;
		Ps__HelloReply *r = (Ps__HelloReply *)recv_msg(&p, 5000, &type, &rc);
		ck_assert_msg(r && r->ok, "the worker's Hello was refused");
		protobuf_c_message_free_unpacked(&r->base, NULL);
		Ps__ReplAck ack = PS__REPL_ACK__INIT;
		ack.lsn = a1.repl_lsn + 1000;
		ack.epoch = a1.repl_epoch + 5;
		ck_assert_int_eq(send_msg(&p, PS_MSG_REPL_ACK, &ack.base, NULL, 0), 0);
		ck_assert_int_ge(first_frame_before_close(&p, 5000), 0);
		close(p.fd);
	}
	a1 = stats_ok(pr);
	ck_assert_int_eq(a1.repl_state, 3);
	ck_assert_uint_eq(a1.repl_epoch, a0.repl_epoch);
	ck_assert_int_eq(stats_ok(bk).repl_state, 2);

	/* a replica Hello naming the shard's own replica index (two processes
	 * started for one address): refused at once, saying so; so are the
	 * Hellos with values out of range (replica 2, a state past primary,
	 * an epoch or batch of 2^53), each naming what is wrong */
	for (int target = 0; target < 2; target++)
	for (int bad = 0; bad < 5; bad++) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons((uint16_t)port[target]),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		struct peer p = { .fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) };
		Ps__Hello h = PS__HELLO__INIT;
		uint8_t nonce[PS_AUTH_NONCE_LEN];
		unsigned type;
		int rc;

		ck_assert_int_eq(connect(p.fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		ps_auth_random(nonce, sizeof(nonce));
		h.protocol_version = PS_PROTOCOL_VERSION;
		h.role = PS__ROLE__ROLE_REPLICA;
		h.rank = -1;
		h.shard_map_hash = map.hash;
		h.replica = bad == 0 ? target : bad == 1 ? 2 : !target;
		h.repl_state = bad == 2 ? 9 : PS__REPL_STATE__REPL_JOINING;
		h.epoch = bad == 3 ? 1ULL << 53 : 0;
		h.lsn = bad == 4 ? 1ULL << 53 : 0;
		h.auth_nonce = (ProtobufCBinaryData){ sizeof(nonce), nonce };
		h.auth_mac = 1;
		/* the shard's own settings, as its partner sends them */
		h.settings = tu_hello_settings(&cfg, 1, secret);
		char want[120];
		if (bad == 0)
			snprintf(want, sizeof(want), "same replica index");
		else if (bad <= 2)
			snprintf(want, sizeof(want), "replica %d in state %u: expected replica 0 or 1",
				 h.replica, h.repl_state);
		else
			snprintf(want, sizeof(want), "replica %d at epoch %llu, batch %llu: out of "
				 "range (at most 2^53 - 1)", h.replica, (unsigned long long)h.epoch,
				 (unsigned long long)h.lsn);
		p.hello_len = protobuf_c_message_get_packed_size(&h.base);
		protobuf_c_message_pack(&h.base, p.hello);
		ck_assert_int_eq(send_raw(&p, PS_MSG_HELLO, p.hello, p.hello_len, NULL, 0), 0);
		if (bad) {
			/* told only to a peer that proves the replication key */
			uint8_t t[32], proof[PS_AUTH_PROOF_LEN];
			Ps__AuthChallenge *ch = (Ps__AuthChallenge *)recv_msg(&p, 5000, &type, &rc);
			ck_assert_msg(ch && type == PS_MSG_AUTH_CHALLENGE, "no challenge (%s due)",
				      want);
			ps_auth_transcript(p.hello, p.hello_len, ch->nonce.data, t);
			protobuf_c_message_free_unpacked(&ch->base, NULL);
			ps_auth_repl_proof(repl_key, t, 0, proof);
			Ps__Auth au = PS__AUTH__INIT;
			au.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
			ck_assert_int_eq(send_msg(&p, PS_MSG_AUTH, &au.base, NULL, 0), 0);
			ps_auth_repl_session_keys(repl_key, t, 0, &p.keys);
			p.keyed = 1;
		}
		Ps__HelloReply *r = (Ps__HelloReply *)recv_msg(&p, 5000, &type, &rc);
		ck_assert_msg(r && type == PS_MSG_HELLO_REPLY && !r->ok && r->error &&
			      strstr(r->error, want), "replica %d answered a Hello (%s due) with %s%s",
			      target, want, r ? ps_wire_type_name(type) : "nothing",
			      r && type == PS_MSG_HELLO_REPLY && r->error ? r->error : "");
		protobuf_c_message_free_unpacked(&r->base, NULL);
		close(p.fd);
	}
	ck_assert_int_eq(stats_ok(pr).repl_state, 3);
	ck_assert_int_eq(stats_ok(bk).repl_state, 2);
	teardown();
}
END_TEST

/* The first slice shard 0 holds. */
static uint32_t slice_of_shard0(void)
{
	uint32_t s0 = 0;

	while (map.slices[s0].shard != 0)
		s0++;
	return s0;
}

/* Batch 41 of epoch 3 with the one slot x (its payload pay, len bytes) to
 * p; then p must be closed with no frame sent back (what names the lie). */
static void batch41_refused(struct peer *p, Ps__ReplSlot *x, const void *pay, uint64_t len,
			    const char *what)
{
	Ps__ReplBatch b = PS__REPL_BATCH__INIT;
	Ps__ReplSlot *xs[1] = { x };
	int got;

	b.lsn = 41;
	b.epoch = 3;
	b.n_slots = 1;
	b.slots = xs;
	ck_assert_int_eq(send_msg(p, PS_MSG_REPL_BATCH, &b.base, pay, len), 0);
	got = first_frame_before_close(p, 5000);
	ck_assert_msg(got == 0, "a batch %s got a %s frame", what,
		      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
	close(p->fd);
}

/* The partner's next dial on lfd answered as the primary of epoch 3 at
 * LSN 40, with a valid snapshot that replica 0 acknowledges. */
static struct peer partner_in_sync(int lfd, const char *what)
{
	struct peer p = accept_dial(lfd, 0);
	unsigned type;
	int rc;

	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	send_snapshot(&p, 3, 40, 5.0f, 5);
	ProtobufCMessage *m = recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(m && type == PS_MSG_REPL_ACK, "no ack of the %s valid snapshot", what);
	protobuf_c_message_free_unpacked(m, NULL);
	return p;
}

/* A partner that holds the replication key (played by the test): what it
 * sends is believed (the control) but range-checked. */
START_TEST(test_partner_contents_range_checked)
{
	struct ps_shard_stats st, st2;
	struct peer p;
	unsigned type;
	int lfd, got, rc;

	setup(5000, ""); /* the backup waits 10 s before taking over: the test is done by then */
	lfd = listen_at(port[1]);
	srv[0] = start_replica(0);

	/* the control: a valid snapshot is acknowledged, replica 0 follows */
	p = accept_dial(lfd, 0);
	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	send_snapshot(&p, 3, 40, 5.0f, 5);
	ProtobufCMessage *m = recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(m && type == PS_MSG_REPL_ACK, "no ack of a valid snapshot (logs in %s)",
		      logdir);
	ck_assert_uint_eq(((Ps__ReplAck *)m)->lsn, 40);
	protobuf_c_message_free_unpacked(m, NULL);
	st = stats_ok(0);
	ck_assert_int_eq(st.repl_state, 2);
	ck_assert_uint_eq(st.repl_epoch, 3);

	/* a batch setting a slice past 2^53 */
	{
		Ps__ReplSlot x = PS__REPL_SLOT__INIT;
		x.slice = slice_of_shard0();
		x.version = UINT64_C(1) << 53;
		x.steps = 5;
		batch41_refused(&p, &x, NULL, 0, "with version 2^53");
	}
	st2 = stats_ok(0);
	ck_assert_uint_eq(st2.param_checksum, st.param_checksum);
	ck_assert_uint_eq(st2.repl_lsn, 40);

	/* a batch with a NaN gradient */
	p = partner_in_sync(lfd, "second");
	{
		Ps__ReplSlot x = PS__REPL_SLOT__INIT;
		uint32_t s0 = slice_of_shard0();
		uint64_t n = (uint64_t)map.slices[s0].count;
		float *g = calloc(n, sizeof(float));
		g[n / 2] = NAN;
		x.slice = s0;
		x.version = 6;
		x.steps = 6;
		x.has_grad = 1;
		x.offset = 0;
		x.length = n * 4;
		batch41_refused(&p, &x, g, n * 4, "with a NaN gradient");
		free(g);
	}
	st2 = stats_ok(0);
	ck_assert_uint_eq(st2.param_checksum, st.param_checksum);

	/* a batch summing the clock before its version from staged gradients
	 * of which none came: refused, saying so (not skipped) */
	p = partner_in_sync(lfd, "third");
	{
		Ps__ReplSlot x = PS__REPL_SLOT__INIT;
		char want[120];
		x.slice = slice_of_shard0();
		x.version = 6;
		x.steps = 6;
		x.sum_staged = 1;
		batch41_refused(&p, &x, NULL, 0, "summing no staged gradient");
		snprintf(want, sizeof(want), "batch 41 sums clock 5 of slice %u, of which no "
			 "gradient came", x.slice);
		ck_assert_msg(log_has(0, want), "no \"%s\" in the log (logs in %s)", want, logdir);
	}
	st2 = stats_ok(0);
	ck_assert_uint_eq(st2.param_checksum, st.param_checksum);
	ck_assert_uint_eq(st2.repl_lsn, 40);

	/* a snapshot of NaN weights, then one past 2^53: refused before the
	 * snapshot completes, the weights as they were */
	for (int k = 0; k < 2; k++) {
		p = accept_dial(lfd, 0);
		ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
		ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
		send_snapshot(&p, 3, 40, k ? 5.0f : NAN, k ? UINT64_C(1) << 53 : 5);
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "a snapshot of %s got a %s frame", k ? "version 2^53" :
			      "NaN weights", got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		st2 = stats_ok(0);
		ck_assert_uint_eq(st2.param_checksum, st.param_checksum);
	}

	/* a snapshot frame of state array 1, which SGD does not have */
	p = accept_dial(lfd, 0);
	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	{
		Ps__ReplSnapshot sn = PS__REPL_SNAPSHOT__INIT;
		uint32_t s0 = 0;
		char want[100];
		while (map.slices[s0].shard != 0)
			s0++;
		float *w = calloc((size_t)map.slices[s0].count, sizeof(float));
		sn.lsn = 40;
		sn.epoch = 3;
		sn.slice = s0;
		sn.which = 1;
		sn.version = 5;
		sn.steps = 5;
		ck_assert_int_eq(send_msg(&p, PS_MSG_REPL_SNAPSHOT, &sn.base, w,
					  (uint64_t)map.slices[s0].count * 4), 0);
		free(w);
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "a snapshot of state array 1 under SGD got a %s frame",
			      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		st2 = stats_ok(0);
		ck_assert_uint_eq(st2.param_checksum, st.param_checksum);
		snprintf(want, sizeof(want), "snapshot frame for slice %u array 1 ", s0);
		ck_assert_msg(log_has(0, want), "no \"%s... does not match this shard\" in the log "
			      "(logs in %s)", want, logdir);
	}
	close(lfd);
	teardown();
}
END_TEST

/* ---- a partner's tables (the row batches and the snapshot's image) ---- */

/* Lies of a snapshot's tables part (TL_OK: none) and of a row batch after
 * it (RL_OK: none), each refused by a check of its own. */
enum { TL_OK, TL_ZERO, TL_TOO_BIG, TL_WALL, TL_ORDER, TL_END, TL_IMAGE, TL_CLOCK, TL_FIN_COUNT,
       TL_FIN_RANGE, TL_END_ };
enum { RL_OK, RL_TABLE, RL_KIND, RL_VERSION, RL_N, RL_LENGTH, RL_OFFSET, RL_SIGHT0, RL_SIGHTS, RL_NAN,
       RL_EXPIRE, RL_END_ };

#define TDIM 4

/* Lies of a membership a snapshot's end or a batch carries (ML_OK: none;
 * one worker in the config). */
enum { ML_OK, ML_HOLDS, ML_RANGE, ML_FREEZE, ML_HELD, ML_RANK, ML_TO, ML_END_ };
static int members_lie = ML_OK; /* for the next send_snapshot_tables or batch */

/* m as members_lie says, in the arrays given; NULL when ML_OK. */
static Ps__ReplMembers *members_of(Ps__ReplMembers *m, Ps__ReplMember *iv, Ps__ReplMember **ivp,
				   uint64_t *hold, uint64_t *freeze)
{
	if (members_lie == ML_OK)
		return NULL;
	ps__repl_members__init(m);
	ps__repl_member__init(iv);
	iv->rank = members_lie == ML_RANK ? 3 : 0;
	iv->from = members_lie == ML_TO ? 5 : 0;
	iv->to = 2;
	iv->open = members_lie != ML_TO;
	*ivp = iv;
	m->n_intervals = 1;
	m->intervals = ivp;
	hold[0] = members_lie == ML_HELD ? PS_MAX_CLOCK + 1 : 0;
	hold[1] = freeze[0] = freeze[1] = 0;
	m->n_hold = members_lie == ML_HOLDS ? 2 : 1;
	m->hold = hold;
	m->joins = members_lie == ML_RANGE ? PS_MAX_CLOCK : 0;
	m->n_freeze = members_lie == ML_FREEZE ? 2 : 1;
	m->freeze = freeze;
	return m;
}

/* A snapshot as send_snapshot's, with the tables' part: table e's image
 * empty (a checkpoint's layout: its header alone), lie as T_* says. */
static void send_snapshot_tables(struct peer *p, int lie)
{
	Ps__ReplSnapshot m = PS__REPL_SNAPSHOT__INIT;
	const struct ps_table_cfg *tc = &cfg.tables[0];
	struct ckpt_table ct[2];
	uint64_t fin[1] = { lie == TL_FIN_RANGE ? PS_MAX_CLOCK : 5 };
	double clocks[1] = { lie == TL_CLOCK ? -1.0 : 0 };
	struct ps_dedup dd[1];
	float *w = calloc(4096, 1);

	memset(ct, 0, sizeof(ct));
	ct[0].key = ps_rows_table_key(tc);
	ct[0].dim = (uint32_t)tc->dim + (lie == TL_IMAGE);
	ct[0].row_floats = (uint32_t)(tc->dim + ps_row_optim_nstate(tc));
	ct[0].wall = (double)time(NULL);
	m.lsn = 40;
	m.epoch = 3;
	for (uint32_t s = 0; s < map.nslices; s++) {
		if (map.slices[s].shard != 0)
			continue;
		m.slice = s;
		m.version = 5;
		m.steps = 5;
		if (send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, w,
			     (uint64_t)map.slices[s].count * 4))
			goto out;
	}
	m.slice = 0;
	m.version = 0;
	m.steps = 0;
	m.tables = 1;
	m.tables_total = lie == TL_ZERO ? 0 : lie == TL_TOO_BIG ? UINT64_C(1) << 40
		       : lie == TL_ORDER ? 2 * sizeof(ct[0]) : sizeof(ct[0]);
	m.table_clocks_wall = lie == TL_WALL ? -5.0 : ps_wall_s();
	if (send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, ct, sizeof(ct[0])))
		goto out;
	if (lie == TL_ORDER) { /* the second half, 8 bytes past where the first ended */
		m.tables_offset = sizeof(ct[0]) + 8;
		if (send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, ct, sizeof(ct[0]) - 8))
			goto out;
	}
	m.tables = 0;
	m.tables_offset = 0;
	m.tables_total = 0;
	m.table_clocks_wall = 0;
	memset(dd, 0, sizeof(dd));
	m.last = 1;
	m.n_finished = lie == TL_FIN_COUNT ? 0 : 1;
	m.finished = fin;
	m.n_table_clocks = lie == TL_END ? 0 : 1;
	m.table_clocks = clocks;
	Ps__ReplMembers mm;
	Ps__ReplMember iv, *ivp;
	uint64_t hold[2], freeze[2];
	m.members = members_of(&mm, &iv, &ivp, hold, freeze);
	send_msg(p, PS_MSG_REPL_SNAPSHOT, &m.base, dd, sizeof(dd));
out:
	free(w);
}

/* A batch (lsn 41) of one row group of table e as lie says: two rows (ids
 * 7 and 9, one sighting each, gradients 1..4 and 5..8); RL_EXPIRE: an
 * expiry of 3 rows instead. */
static void send_row_batch(struct peer *p, int lie)
{
	enum { REC = 8 + 4 + 4 * TDIM };
	Ps__ReplBatch b = PS__REPL_BATCH__INIT;
	Ps__ReplRows x = PS__REPL_ROWS__INIT, *xs[1] = { &x };
	uint8_t pay[2 * REC];

	for (int r = 0; r < 2; r++) {
		uint64_t id = r ? 9 : 7;
		uint32_t k = lie == RL_SIGHT0 ? 0 : lie == RL_SIGHTS ? 2 : 1;
		float g[TDIM];
		for (int d = 0; d < TDIM; d++)
			g[d] = lie == RL_NAN && r ? NAN : (float)(r * TDIM + d + 1);
		memcpy(pay + r * REC, &id, 8);
		memcpy(pay + r * REC + 8, &k, 4);
		memcpy(pay + r * REC + 12, g, sizeof(g));
	}
	x.table = lie == RL_TABLE ? 1 : 0;
	x.kind = lie == RL_KIND ? 2 : lie == RL_EXPIRE ? 1 : 0;
	x.version = lie == RL_VERSION ? PS_MAX_CLOCK : 6;
	x.stamp = 1;
	x.n = lie == RL_N ? 1000 : lie == RL_EXPIRE ? 3 : 2;
	x.offset = lie == RL_OFFSET ? sizeof(pay) + 1 : 0;
	x.length = lie == RL_LENGTH ? sizeof(pay) - 1 : lie == RL_EXPIRE ? 0 : sizeof(pay);
	b.lsn = 41;
	b.epoch = 3;
	b.n_rows = 1;
	b.rows = xs;
	ck_assert_int_eq(send_msg(p, PS_MSG_REPL_BATCH, &b.base, pay,
				  lie == RL_EXPIRE ? 0 : sizeof(pay)), 0);
}

/* Lies of a batch's dense part and marks (BL_OK: none), after an honest
 * snapshot. */
enum { BL_OK, BL_GAP, BL_FINISHED, BL_EPOCH, BL_LR, BL_MARK_RANK, BL_MARK_SEQ, BL_FIN_RANGE,
       BL_END_ };

static void send_batch_lie(struct peer *p, int lie)
{
	Ps__ReplBatch b = PS__REPL_BATCH__INIT;
	Ps__ReplSlot x = PS__REPL_SLOT__INIT, *xs[1] = { &x };
	Ps__ReplMark mk = PS__REPL_MARK__INIT, *mks[1] = { &mk };
	uint64_t fin[2] = { lie == BL_FIN_RANGE ? PS_MAX_CLOCK : 1, 1 };
	uint32_t s0 = 0;
	Ps__ReplMembers mm;
	Ps__ReplMember iv, *ivp;
	uint64_t hold[2], freeze[2];

	while (map.slices[s0].shard != 0)
		s0++;
	b.lsn = lie == BL_GAP ? 43 : 41;
	b.epoch = lie == BL_EPOCH ? PS_MAX_CLOCK : 3;
	x.slice = s0;
	x.version = 6;
	x.steps = 6;
	x.has_lr = 1;
	x.lr = lie == BL_LR ? -1.0f : 0.5f;
	b.n_slots = 1;
	b.slots = xs;
	if (lie == BL_FINISHED || lie == BL_FIN_RANGE) {
		b.n_finished = lie == BL_FINISHED ? 2 : 1; /* one worker */
		b.finished = fin;
	}
	b.members = members_of(&mm, &iv, &ivp, hold, freeze);
	if (lie == BL_MARK_RANK || lie == BL_MARK_SEQ) {
		mk.rank = lie == BL_MARK_RANK ? 5 : 0;
		mk.seq = lie == BL_MARK_SEQ ? 0 : 1;
		b.n_marks = 1;
		b.marks = mks;
	}
	ck_assert_int_eq(send_msg(p, PS_MSG_REPL_BATCH, &b.base, NULL, 0), 0);
}

/* Lies of a batch's declarations (DL_OK: none): table g (dim 2, sgd)
 * declared beside the config's e, or tensors declared. */
enum { DL_OK, DL_COUNT, DL_WALL, DL_CLOCK, DL_VERSION, DL_BAD, DL_VALUES, DL_TENSORS, DL_END_ };

static void send_decl_lie(struct peer *p, int lie)
{
	Ps__ReplBatch b = PS__REPL_BATCH__INIT;
	Ps__DeclareTables dt = PS__DECLARE_TABLES__INIT;
	Ps__TableDef td = PS__TABLE_DEF__INIT, *tds[1] = { &td };
	Ps__Declare d = PS__DECLARE__INIT;
	char *names[1] = { "w" };
	uint32_t ndims[1] = { 1 };
	int64_t dims[1] = { 16 };
	double clocks[1] = { lie == DL_CLOCK ? -1.0 : 2.0 };
	uint64_t versions[1] = { lie == DL_VERSION ? PS_MAX_CLOCK : 3 };
	float vals[16] = { 0 };

	b.lsn = 41;
	b.epoch = 3;
	if (lie == DL_VALUES || lie == DL_TENSORS) {
		d.n_names = 1;
		d.names = names;
		d.n_ndims = 1;
		d.ndims = ndims;
		d.n_dims = 1;
		d.dims = dims;
		d.values = 1;
		b.declare = &d;
		b.declare_offset = lie == DL_VALUES ? sizeof(vals) + 4 : 0;
		b.declare_length = sizeof(vals);
		ck_assert_int_eq(send_msg(p, PS_MSG_REPL_BATCH, &b.base, vals, sizeof(vals)), 0);
		return;
	}
	td.name = "g";
	td.dim = lie == DL_BAD ? 0 : 2;
	td.lr = 1.0f; /* the rest as model.embeddings' defaults */
	td.eps = 1e-8f;
	td.beta1 = 0.9f;
	td.beta2 = 0.999f;
	td.ftrl_beta = 1.0f;
	td.filter_ids = 1048576;
	dt.n_tables = 1;
	dt.tables = tds;
	b.declare_tables = &dt;
	b.n_decl_table_clocks = lie == DL_COUNT ? 0 : 1;
	b.decl_table_clocks = clocks;
	b.n_decl_table_versions = 1;
	b.decl_table_versions = versions;
	b.decl_table_clocks_wall = lie == DL_WALL ? -1.0 : ps_wall_s();
	ck_assert_int_eq(send_msg(p, PS_MSG_REPL_BATCH, &b.base, NULL, 0), 0);
}

/* The backup's next link (it dials the test), the handshake served and
 * the state transfer sent as lie says (send_snapshot_tables). */
static struct peer link_with_snapshot(int lfd, int lie)
{
	struct peer p = accept_dial(lfd, 0);

	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	send_snapshot_tables(&p, lie);
	return p;
}

/* The same with the honest transfer, acknowledged: the link's batches
 * follow (lsn 41). */
static struct peer honest_link(int lfd)
{
	struct peer p = link_with_snapshot(lfd, TL_OK);
	unsigned type;
	int rc;
	ProtobufCMessage *m = recv_msg(&p, 5000, &type, &rc);

	ck_assert_msg(m && type == PS_MSG_REPL_ACK, "no ack of an honest snapshot with tables "
		      "(logs in %s)", logdir);
	protobuf_c_message_free_unpacked(m, NULL);
	return p;
}

/* A partner that holds the replication key sends the embedding tables
 * (the snapshot's image of them and its end, then batches: their dense
 * part, marks, row groups and declarations) with each of their checks'
 * lies in turn:
 * each is refused, the link closed, the reason in the backup's log (where
 * the check gives one), and its weights and table left as they were; the
 * honest snapshot and batch are taken (the control): the backup then
 * holds the rows, its table at the batch's version. */
START_TEST(test_partner_rows_range_checked)
{
	static const char *snap_why[TL_END_] = {
		"",
		"snapshot with 0 bytes of embedding tables; this shard has 1 tables",
		"snapshot with 1099511627776 bytes of embedding tables; this shard has 1 tables",
		"snapshot with the tables' clocks read at -5 s of the primary's wall clock: out of "
		"range",
		"of the tables' 224 after 112: out of order",
		"snapshot end with 0 tables and 112 of 112 bytes of them; this shard has 1 tables",
		"the snapshot's embedding tables: table 0 is not 'e' of dim 4",
		"snapshot with table 0 at -1 s since its epoch: out of range",
		"snapshot end with 0 clocks and",
		"", /* a finished clock of 2^53: refused without a line */
	};
	static const char *decl_why[DL_END_] = {
		"", "batch 41 declares 1 tables with 0 clocks and 1 versions",
		"batch 41 declares tables with their clocks read at -1 s of the primary's wall "
		"clock: out of range",
		"batch 41 declares table 0 at -1 s since its epoch, version 3: out of range",
		"batch 41 declares table 0 at 2 s since its epoch, version 9007199254740992: out of "
		"range",
		"batch 41: the primary's declaration of tables does not hold here: ",
		"batch 41 declares tensors with values at 68..+64 of a 64-byte payload",
		"batch 41: the primary's declaration of tensors does not hold here: ",
	};
	static const char *batch_why[BL_END_] = {
		"", "batch 43 after batch 40: a gap", "",
		"batch 41 of epoch 9007199254740992: out of range", "batch 41 applies slice ", "",
		"", "",
	};
	static const char *members_why[ML_END_] = {
		"", "2 holds for 1 workers",
		"9007199254740992 joins and 0 leaves, map epoch 0: out of range",
		"2 leave clocks for 1 workers",
		"worker 0 held at 9007199254740992 or frozen at 18446744073709551615: out of range",
		"interval 0: worker 3, clocks 0..open 2 (workers 0..0, from <= to < 2^53)",
		"interval 0: worker 0, clocks 5..2 (workers 0..0, from <= to < 2^53)",
	};
	static const char *row_why[RL_END_] = {
		"",
		"batch 41 changes table 1 (kind 0, version 6): not this shard's",
		"batch 41 changes table 0 (kind 2, version 6): not this shard's",
		"batch 41 changes table 0 (kind 0, version 9007199254740992): not this shard's",
		"batch 41 holds 1000 rows of table 'e' in 56 bytes at 0: not in its 56 bytes",
		"batch 41 holds 2 rows of table 'e' in 55 bytes at 0: not in its 56 bytes",
		"batch 41 holds 2 rows of table 'e' in 56 bytes at 57: not in its 56 bytes",
		"batch 41 updates a row of table 'e' with 0 sightings or gradients that are not "
		"finite",
		"batch 41 updates a row of table 'e' with 2 sightings or gradients that are not "
		"finite",
		"batch 41 updates a row of table 'e' with 1 sightings or gradients that are not "
		"finite",
		"table 'e': 0 rows expired here, 3 on the primary: the copies differ",
	};
	struct ps_shard_stats st;
	struct peer p;
	unsigned type;
	int lfd, got, rc;

	ck_assert_uint_eq(sizeof(struct ckpt_table), 112); /* the reasons' byte counts */
	model_extra = "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}\n";
	setup(5000, "");
	model_extra = "";
	lfd = listen_at(port[1]);
	srv[0] = start_replica(0);
	for (int lie = TL_END_ - 1; lie > TL_OK; lie--) {
		p = link_with_snapshot(lfd, lie);
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "snapshot lie %d got a %s frame", lie,
			      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		ck_assert_msg(log_has(0, snap_why[lie]), "snapshot lie %d: no '%s' in the log (%s)",
			      lie, snap_why[lie], logdir);
	}
	p = honest_link(lfd); /* the control */
	ProtobufCMessage *m;
	uint64_t sum = stats_ok(0).param_checksum;
	/* a membership the shard cannot hold, at a snapshot's end (where 0)
	 * and in a batch (1) */
	for (int ml = ML_END_ - 1; ml > ML_OK; ml--)
		for (int where = 0; where < 2; where++) {
			char want[300];
			members_lie = ml;
			if (where == 0) { /* a new link: the snapshot is the lie */
				close(p.fd);
				p = link_with_snapshot(lfd, TL_OK);
				snprintf(want, sizeof(want), "snapshot end with a membership this shard "
					 "cannot hold: %s", members_why[ml]);
			} else {
				send_batch_lie(&p, BL_OK);
				snprintf(want, sizeof(want), "batch 41 holds a membership this shard "
					 "cannot: %s", members_why[ml]);
			}
			members_lie = ML_OK;
			got = first_frame_before_close(&p, 5000);
			ck_assert_msg(got == 0, "membership lie %d (%s) got a %s frame", ml,
				      where ? "batch" : "snapshot",
				      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
			close(p.fd);
			ck_assert_msg(log_has(0, want), "no '%s' in the log (%s)", want, logdir);
			p = honest_link(lfd);
		}
	for (int lie = BL_END_ - 1; lie > BL_OK; lie--) {
		send_batch_lie(&p, lie);
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "batch lie %d got a %s frame", lie,
			      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		ck_assert_msg(log_has(0, batch_why[lie]), "batch lie %d: no '%s' in the log (%s)",
			      lie, batch_why[lie], logdir);
		st = stats_ok(0);
		ck_assert_msg(st.param_checksum == sum && st.repl_lsn == 40, "batch lie %d: the "
			      "backup's weights or batch changed", lie);
		p = honest_link(lfd);
	}
	for (int lie = RL_END_ - 1; lie >= RL_OK; lie--) {
		if (lie != RL_END_ - 1) /* a link of its own: the lie before closed it */
			p = honest_link(lfd);
		send_row_batch(&p, lie);
		if (lie == RL_OK)
			break;
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "row lie %d got a %s frame", lie,
			      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		ck_assert_msg(log_has(0, row_why[lie]), "row lie %d: no '%s' in the log (%s)", lie,
			      row_why[lie], logdir);
		st = stats_ok(0);
		ck_assert_msg(st.ntables == 1 && st.tables[0].rows == 0, "row lie %d: the backup's "
			      "table holds %llu rows", lie, (unsigned long long)st.tables[0].rows);
	}
	m = recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(m && type == PS_MSG_REPL_ACK && ((Ps__ReplAck *)m)->lsn == 41,
		      "no ack of the honest row batch (logs in %s)", logdir);
	protobuf_c_message_free_unpacked(m, NULL);
	st = stats_ok(0);
	ck_assert_uint_eq(st.tables[0].rows, 2);
	ck_assert_uint_eq(st.tables[0].version, 6);
	close(p.fd);
	/* the declarations a batch carries: each lie on a link of its own */
	for (int lie = DL_END_ - 1; lie >= DL_OK; lie--) {
		p = honest_link(lfd);
		send_decl_lie(&p, lie);
		if (lie == DL_OK)
			break;
		got = first_frame_before_close(&p, 5000);
		ck_assert_msg(got == 0, "declaration lie %d got a %s frame", lie,
			      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
		close(p.fd);
		ck_assert_msg(log_has(0, decl_why[lie]), "declaration lie %d: no '%s' in the log "
			      "(%s)", lie, decl_why[lie], logdir);
		st = stats_ok(0);
		ck_assert_msg(st.ntables == 1, "declaration lie %d: %d tables", lie, st.ntables);
	}
	m = recv_msg(&p, 5000, &type, &rc);
	ck_assert_msg(m && type == PS_MSG_REPL_ACK && ((Ps__ReplAck *)m)->lsn == 41,
		      "no ack of the honest declaration (logs in %s)", logdir);
	protobuf_c_message_free_unpacked(m, NULL);
	ck_assert_msg(log_has(0, "the primary's 1 declared tables adopted"), "logs in %s", logdir);
	st = stats_ok(0);
	ck_assert_int_eq(st.ntables, 2);
	ck_assert_str_eq(st.tables[1].name, "g");
	ck_assert_uint_eq(st.tables[1].version, 3);
	close(p.fd);
	close(lfd);
	teardown();
}
END_TEST

/* security.mac: false: the replication link is MACed all the same. A
 * partner that proved the key but then sends a frame without a MAC is not
 * believed; with MACs it is, and the dialer's own frames carry them. */
START_TEST(test_link_maced_without_security_mac)
{
	struct peer p;
	unsigned type;
	int lfd, got, rc;

	setup(5000, "security:\n  mac: false\n");
	ck_assert_int_eq(cfg.security.mac, 0);
	lfd = listen_at(port[1]);
	srv[0] = start_replica(0);

	p = accept_dial(lfd, 0);
	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	p.keyed = 0; /* the reply in clear, as security.mac: false would send it */
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	send_snapshot(&p, 3, 40, 5.0f, 5);
	p.keyed = 1;
	got = first_frame_before_close(&p, 5000);
	ck_assert_msg(got == 0, "a HelloReply without a MAC after the handshake got a %s frame",
		      got > 0 ? ps_wire_type_name((unsigned)got) : "no close");
	close(p.fd);
	ck_assert_int_eq(stats_ok(0).repl_state, 1);

	p = accept_dial(lfd, 0);
	ck_assert_int_eq(serve_challenge(&p, repl_key, 1), 0);
	ck_assert_int_eq(send_reply(&p, 1, PS__REPL_STATE__REPL_PRIMARY, 3, 40), 0);
	send_snapshot(&p, 3, 40, 5.0f, 5);
	ProtobufCMessage *m = recv_msg(&p, 5000, &type, &rc); /* checks its MAC */
	ck_assert_msg(m && type == PS_MSG_REPL_ACK, "no ack of a MACed snapshot (logs in %s)",
		      logdir);
	protobuf_c_message_free_unpacked(m, NULL);
	ck_assert_int_eq(stats_ok(0).repl_state, 2);
	close(p.fd);
	close(lfd);
	teardown();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("replica_auth");
	TCase *tc = tcase_create("processes");

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_impostor_partner_not_believed);
	TU_ADD(tc, test_cluster_secret_cannot_pose_as_replica);
	TU_ADD(tc, test_partner_contents_range_checked);
	TU_ADD(tc, test_partner_rows_range_checked);
	TU_ADD(tc, test_link_maced_without_security_mac);
	TU_ADD(tc, test_partner_settings_must_agree);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int rc;

	signal(SIGPIPE, SIG_IGN); /* the impostor writes on after the dialer hung up */
	tu_secret_setup();
	rc = tu_run_suite(suite());
	tu_secret_cleanup();
	return rc;
}
