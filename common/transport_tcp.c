/* transport_tcp.c - the tcp transport on libuv.
 *
 * Receive path: a connection reads into a 64 KiB staging buffer while it
 * waits for a header. Once a header is decoded and checked, one buffer of
 * meta_len + payload_len bytes is allocated; the bytes already staged are
 * moved into it and the rest is read straight into it by pointing libuv's
 * alloc callback at the unfilled part, so a large payload crosses from the
 * socket to the decoder without a copy. The buffer is handed to on_frame.
 *
 * Send path: header + metadata go in one small copied buffer, the payload
 * pieces follow as separate uv_buf_t (writev). Volatile payloads are first
 * offered to uv_try_write; only what the socket does not take is copied.
 * Volatile frames sent while the frames of one read are being delivered (a
 * shard's push ack and pull reply) are gathered in a small outbox and leave
 * in one write when the read has been handled.
 *
 * Backpressure: with limits.max_queue set, a connection stops taking frames
 * (uv_read_stop, between frames, what is staged kept) while more than that
 * many bytes it was sent wait to leave, so a peer that sends requests and
 * does not read the replies holds at most max_queue plus one reply; the
 * transport's max_queue_total bounds all connections together the same
 * way. A write completing resumes the connections paused, once they are
 * back under half their bound (three quarters of the total).
 *
 * Each payload is checked for non-finite float32 words as it arrives
 * (ps_words_finite on the bytes just read, still in cache) and the result
 * handed on in ps_frame.payload_finite.
 *
 * After set_keys every frame carries a sequence number and a Poly1305 tag
 * (frame_mac.h), or, with a cipher, is an AEAD record whose tag takes the
 * MAC's place (frame_aead.h). The sender seals a frame (numbers it, encodes
 * its header, computes the tag, encrypts into a buffer of its own) under
 * wmu at the moment its place in the byte stream is fixed, so numbers
 * follow the order on the wire; the receiver folds the bytes into the tag
 * (decrypting them in place) as they arrive, before the finiteness scan,
 * and checks it before the frame is handed on.
 *
 * send_now, one of two entry points callable from another thread, writes
 * small frames with sendmsg() on the socket directly, so a client's request
 * leaves without waking the loop thread. It may only write when libuv has
 * nothing queued on the connection (else the bytes would interleave), so
 * every write path and tcp_close take the connection's wmu, nwrites counts
 * the uv_write requests not yet completed, and a closing connection is
 * never written (its fd may already be gone).
 *
 * recv_now, the other, lets a client's waiting thread read its reply off
 * the socket itself instead of waiting for the loop thread to wake up and
 * hand it over. Both readers share one receive state machine under rmu: the
 * loop thread holds it from libuv's alloc callback to the end of its read
 * callback (libuv calls one after the other, always paired), recv_now only
 * tries it, and tcp_close takes it so the fd is never closed under a
 * recv_now. A bad frame found by recv_now cannot close the connection from
 * that thread: it records the reason and shuts the socket down, and the
 * loop thread, woken by the shutdown, closes it with that reason.
 *
 * Lock order: the loop thread takes rmu and then, in on_frame, the owner's
 * lock; the owner may hold its lock when it calls close (rmu). That is not
 * a deadlock because the only other holder of rmu, recv_now, takes it with
 * trylock and returns at once (ThreadSanitizer still reports the
 * inversion: it does not know the other thread never waits).
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "ps_err.h"
#include "ps_log.h"
#include "finite.h"
#include "frame_aead.h"
#include "frame_mac.h"
#include "transport.h"

#define STAGE_BYTES (64 * 1024)
#define MAX_IOV 1024
#define OUTBOX_BYTES (64 * 1024)

struct tcp_transport {
	struct ps_transport base;
	uv_tcp_t listener;
	int listening;
	int destroying;
	int nconns;
	struct tcp_conn *conns;   /* list of live connections */
	/* backpressure (loop thread): bytes queued on every connection as
	 * last counted, the most one had, connections paused now */
	uint64_t queued, peak, peak_total;
	int npaused;
	/* a connection that could not be given a tcp_conn (out of memory) is
	 * accepted on this handle and closed: libuv watches the listener
	 * again only once the connection it offered is accepted */
	uv_tcp_t reject;
	int rejecting, reject_again;
};

struct tcp_conn {
	struct ps_conn base;
	uv_tcp_t handle;
	uv_connect_t connect_req;
	struct ps_wire_limits limits;
	int closing;              /* set under wmu */
	int close_status;
	int connected;            /* set under wmu */
	pthread_mutex_t wmu;      /* serialises writes with send_now (see top) */
	pthread_mutex_t rmu;      /* serialises reads with recv_now (see top) */
	int loop_reading;         /* the loop thread holds rmu (alloc to read callback) */
	int loop_waiting;         /* the loop thread waits for rmu: recv_now keeps off */
	int rx_status;            /* recv_now found a bad frame: the close reason */
	ps_take_cb take;          /* recv_now: where frames go instead of on_frame */
	void *take_arg;
	int ntaken;
	int nwrites;              /* uv_write requests not completed, under wmu */
	int write_failed;         /* a write failed and was logged (once per connection) */
	int in_read;              /* frames of one read are being delivered */
	int paused;               /* reading stopped by backpressure (loop thread) */
	size_t q_counted;         /* this connection's part of tt->queued */
	uint8_t *outbox;          /* small volatile frames sent meanwhile */
	size_t outbox_len;
	struct tcp_conn *prev, *next;
	/* receive state */
	uint8_t *stage;
	size_t stage_fill;
	struct ps_frame_hdr hdr;
	uint8_t *body;            /* frame being filled, NULL while staging */
	uint8_t *body_data;       /* where its metadata starts inside body */
	uint64_t body_len, body_fill;
	uint64_t scan_pos;        /* payload bytes checked by ps_words_finite */
	int scan_bad;             /* a non-finite word was seen */
	/* authentication (set_keys); send side under wmu */
	int keyed;
	struct ps_frame_keys keys;
	uint64_t send_seq, recv_seq;
	struct ps_mac rmac;       /* tag of the frame being received */
	struct ps_mac smac;       /* tag of the frame being sent, under wmu */
	int rmac_on;              /* that frame carries one */
	uint64_t mac_pos;         /* body bytes folded into rmac */
	int cipher;               /* -1: MACs; else frames are AEAD records (frame_aead.h) */
	struct ps_aead raead;     /* opens the frames received (cipher >= 0) */
	struct ps_aead saead;     /* seals the frames sent, under wmu */
};

struct tcp_write {
	uv_write_t req;
	struct tcp_conn *conn;
	ps_send_cb cb;
	void *arg;
	uint8_t *copy;            /* volatile remainder, freed after the write */
	uint8_t *sealed;          /* an encrypted frame, whole, freed after the write */
	uint8_t *gathered;        /* payload pieces past MAX_IOV, copied together */
	uint8_t tag[PS_MAC_TAG_LEN];
	uint8_t head[];           /* header + meta */
};

static void frame_free(struct ps_frame *f)
{
	free(f);
}

static void crypto_free(struct tcp_conn *c)
{
	sodium_memzero(&c->keys, sizeof(c->keys));
	ps_mac_free(&c->rmac);
	ps_mac_free(&c->smac);
	ps_aead_free(&c->raead);
	ps_aead_free(&c->saead);
}

static void write_free(struct tcp_write *w)
{
	free(w->copy);
	free(w->sealed);
	free(w->gathered);
	free(w);
}

/* The per-connection crypto state: 0 or -ENOMEM (nothing left allocated). */
static int crypto_init(struct tcp_conn *c)
{
	c->cipher = -1;
	if (ps_mac_init(&c->rmac) || ps_mac_init(&c->smac) || ps_aead_init(&c->raead) ||
	    ps_aead_init(&c->saead)) {
		crypto_free(c);
		return -ENOMEM;
	}
	return 0;
}

static void conn_unlink(struct tcp_transport *tt, struct tcp_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else if (tt->conns == c)
		tt->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	tt->nconns--;
}

static void maybe_finish_destroy(struct tcp_transport *tt);
static void flush_outbox(struct tcp_conn *c);
static void lock_rx(struct tcp_conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static void on_handle_closed(uv_handle_t *h)
{
	struct tcp_conn *c = h->data;
	struct tcp_transport *tt = container_of(c->base.t, struct tcp_transport, base);

	conn_unlink(tt, c);
	if (tt->base.cbs.on_close)
		tt->base.cbs.on_close(&c->base, c->close_status);
	free(c->body);
	free(c->stage);
	free(c->outbox);
	pthread_mutex_destroy(&c->wmu);
	pthread_mutex_destroy(&c->rmu);
	crypto_free(c);
	free(c);
	maybe_finish_destroy(tt);
}

static void on_handle_closed_quiet(uv_handle_t *h)
{
	struct tcp_conn *c = h->data;

	free(c->stage);
	free(c->outbox);
	pthread_mutex_destroy(&c->wmu);
	pthread_mutex_destroy(&c->rmu);
	crypto_free(c);
	free(c);
}

/* ---- backpressure (loop thread) ---- */

static struct tcp_transport *tt_of(struct tcp_conn *c)
{
	return container_of(c->base.t, struct tcp_transport, base);
}

static int queue_bounded(struct tcp_conn *c)
{
	return c->limits.max_queue || tt_of(c)->base.limits.max_queue_total;
}

/* Counts c's queue (libuv's and the outbox) into the transport's total. */
static size_t count_queue(struct tcp_conn *c)
{
	struct tcp_transport *tt = tt_of(c);
	size_t q = uv_stream_get_write_queue_size((uv_stream_t *)&c->handle) + c->outbox_len;

	tt->queued = tt->queued - c->q_counted + q;
	c->q_counted = q;
	if (q > tt->peak)
		tt->peak = q;
	if (tt->queued > tt->peak_total)
		tt->peak_total = tt->queued;
	return q;
}

static void uncount_queue(struct tcp_conn *c)
{
	struct tcp_transport *tt = tt_of(c);

	tt->queued -= c->q_counted;
	c->q_counted = 0;
	if (c->paused) {
		c->paused = 0;
		tt->npaused--;
	}
}

/* Nonzero when c must stop taking frames: too much queued for it, or for
 * every connection together. */
static int over_queue(struct tcp_conn *c)
{
	uint64_t total = tt_of(c)->base.limits.max_queue_total;
	size_t q;

	if (!queue_bounded(c))
		return 0;
	q = count_queue(c);
	return (c->limits.max_queue && q > c->limits.max_queue) ||
	       (total && tt_of(c)->queued > total);
}

static void pause_reading(struct tcp_conn *c)
{
	if (c->paused)
		return;
	uv_read_stop((uv_stream_t *)&c->handle);
	c->paused = 1;
	tt_of(c)->npaused++;
}

static int drain_stage(struct tcp_conn *c);

/* Takes the frames c has staged, then reads again unless that paused it
 * anew. */
static void resume_reading(struct tcp_conn *c)
{
	int closed;

	c->paused = 0;
	tt_of(c)->npaused--;
	lock_rx(c);
	c->in_read = 1;
	closed = drain_stage(c);
	c->in_read = 0;
	c->loop_reading = 0;
	pthread_mutex_unlock(&c->rmu);
	flush_outbox(c);
	if (!closed && !c->closing && !c->paused)
		uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
}

/* A write completed: resumes the paused connections back under their
 * bounds (half of max_queue, three quarters of max_queue_total). */
static void resume_paused(struct tcp_transport *tt)
{
	uint64_t total = tt->base.limits.max_queue_total;

	for (struct tcp_conn *c = tt->conns; c && tt->npaused; c = c->next) {
		if (!c->paused || c->closing)
			continue;
		size_t q = count_queue(c);
		if ((c->limits.max_queue && q > c->limits.max_queue / 2) ||
		    (total && tt->queued > total - total / 4))
			continue;
		resume_reading(c);
	}
}

static void tcp_close(struct ps_conn *pc, int status)
{
	struct tcp_conn *c = container_of(pc, struct tcp_conn, base);
	int lock_r = !c->loop_reading; /* else this thread holds rmu already */

	if (c->closing)
		return;
	if (lock_r)
		pthread_mutex_lock(&c->rmu);
	pthread_mutex_lock(&c->wmu);
	if (c->outbox_len) {
		/* What was sent before the close leaves if the socket takes it,
		 * as a direct write would have (an error reply before closing). */
		uv_buf_t buf = uv_buf_init((char *)c->outbox, (unsigned)c->outbox_len);
		uv_try_write((uv_stream_t *)&c->handle, &buf, 1);
		c->outbox_len = 0;
	}
	c->closing = 1;
	pthread_mutex_unlock(&c->wmu);
	uncount_queue(c);
	c->close_status = status;
	uv_close((uv_handle_t *)&c->handle, on_handle_closed);
	if (lock_r)
		pthread_mutex_unlock(&c->rmu);
}

static struct tcp_conn *conn_new(struct tcp_transport *tt)
{
	struct tcp_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->stage = malloc(STAGE_BYTES);
	if (!c->stage || crypto_init(c)) {
		free(c->stage);
		free(c);
		return NULL;
	}
	pthread_mutex_init(&c->wmu, NULL);
	pthread_mutex_init(&c->rmu, NULL);
	c->base.t = &tt->base;
	c->limits = tt->base.limits;
	uv_tcp_init(tt->base.loop, &c->handle);
	c->handle.data = c;
	c->next = tt->conns;
	if (tt->conns)
		tt->conns->prev = c;
	tt->conns = c;
	tt->nconns++;
	return c;
}

/* Checks the payload words that arrived since the last call (fill bytes of
 * the body are in), while they are still in cache, and folds the new bytes
 * into the frame's tag, decrypting them in place first on an encrypted
 * connection. Bytes of the tag itself (after the payload) are neither. */
static void scan_body(struct tcp_conn *c, const uint8_t *data, uint64_t fill)
{
	uint64_t body = c->hdr.meta_len + c->hdr.payload_len;
	uint64_t have, end;

	if (fill > body)
		fill = body;
	if (c->rmac_on && fill > c->mac_pos) {
		uint8_t *p = (uint8_t *)data + c->mac_pos;
		size_t n = (size_t)(fill - c->mac_pos);

		if (c->cipher >= 0)
			ps_aead_update(&c->raead, p, p, n);
		else
			ps_mac_update(&c->rmac, p, n);
		c->mac_pos = fill;
	}
	have = fill > c->hdr.meta_len ? fill - c->hdr.meta_len : 0;
	end = have & ~(uint64_t)3;
	if (end > c->scan_pos && !c->scan_bad)
		c->scan_bad = !ps_words_finite(data + c->hdr.meta_len + c->scan_pos,
					       (size_t)(end - c->scan_pos) / 4);
	if (end > c->scan_pos)
		c->scan_pos = end;
}

/* The frame being received is bad: closes c with status, or, inside
 * recv_now (another thread, which must not close), records status and
 * shuts the socket so the loop thread wakes up and closes c with it. */
static void fail_rx(struct tcp_conn *c, int status)
{
	int fd;

	if (!c->take) {
		tcp_close(&c->base, status);
		return;
	}
	c->rx_status = status;
	if (uv_fileno((uv_handle_t *)&c->handle, &fd) == 0)
		shutdown(fd, SHUT_RDWR);
}

/* Hands a complete body to the owner (or closes c when its tag is wrong);
 * returns nonzero if c got closed. */
static int deliver(struct tcp_conn *c, uint8_t *body, uint8_t *data)
{
	struct ps_frame *f = (struct ps_frame *)body;
	uint64_t len = c->hdr.meta_len + c->hdr.payload_len;

	scan_body(c, data, len);
	if (c->rmac_on) {
		c->rmac_on = 0;
		if (c->cipher >= 0 ? ps_aead_open_end(&c->raead, data + len)
				   : ps_mac_verify(&c->rmac, data + len)) {
			ps_warn("closing connection from %s: %s frame %llu failed its MAC (altered "
				"on the way, or sent under another key)", c->base.peer,
				ps_wire_type_name(c->hdr.type), (unsigned long long)c->recv_seq);
			free(body);
			fail_rx(c, PS_EAUTH);
			return 1;
		}
		c->recv_seq++;
		c->base.bytes_in += PS_MAC_TAG_LEN;
	}
	f->payload_finite = !c->scan_bad;
	f->hdr = c->hdr;
	f->meta = data;
	f->payload = data + c->hdr.meta_len;
	f->release = frame_free;
	c->base.bytes_in += PS_WIRE_HDR_LEN + len;
	if (c->take) {
		c->ntaken++;
		c->take(&c->base, f, c->take_arg);
		return 0;
	}
	c->base.t->cbs.on_frame(&c->base, f);
	return c->closing;
}

/* Whether the header just decoded carries what the connection's state
 * demands (ps_frame_check_auth). */
static int check_auth_hdr(struct tcp_conn *c, char *why, size_t whylen)
{
	return ps_frame_check_auth(&c->hdr, c->keyed, c->cipher, c->recv_seq, why, whylen);
}

/* Where the next bytes received go: the body being filled, or staging. */
static void rx_buf(struct tcp_conn *c, uv_buf_t *buf)
{
	if (c->body) {
		uint64_t left = c->body_len - c->body_fill;
		buf->base = (char *)c->body_data + c->body_fill;
		buf->len = left > (1u << 30) ? (1u << 30) : (size_t)left;
	} else {
		buf->base = (char *)c->stage + c->stage_fill;
		buf->len = STAGE_BYTES - c->stage_fill;
	}
}

/* The loop thread takes rmu. A thread polling with recv_now could take it
 * again and again and starve this one: it keeps off while loop_waiting is
 * set. */
static void lock_rx(struct tcp_conn *c)
{
	if (pthread_mutex_trylock(&c->rmu)) {
		__atomic_store_n(&c->loop_waiting, 1, __ATOMIC_RELAXED);
		pthread_mutex_lock(&c->rmu);
		__atomic_store_n(&c->loop_waiting, 0, __ATOMIC_RELAXED);
	}
	c->loop_reading = 1;
}

/* rmu is held from here to the end of on_read: libuv calls the read
 * callback after every alloc callback (and, on a hang-up, once without
 * one, which on_read covers). */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct tcp_conn *c = h->data;

	(void)suggested;
	lock_rx(c);
	rx_buf(c, buf);
}

/* Parses whole frames out of the staging buffer; starts a body when one
 * does not fit. Returns nonzero when the connection was closed. */
static int drain_stage(struct tcp_conn *c)
{
	size_t pos = 0;
	char why[200];

	while (!c->body && c->stage_fill - pos >= PS_WIRE_HDR_LEN) {
		if (over_queue(c)) {
			pause_reading(c); /* the rest stays staged until resume_reading */
			break;
		}
		int rc = ps_wire_decode_hdr(c->stage + pos, &c->limits, &c->hdr, why, sizeof(why));
		if (!rc)
			rc = check_auth_hdr(c, why, sizeof(why));
		if (rc) {
			ps_warn("closing connection from %s: %s", c->base.peer, why);
			fail_rx(c, rc);
			return 1;
		}
		c->rmac_on = c->keyed;
		if (c->rmac_on && c->cipher >= 0) {
			ps_aead_begin(&c->raead, c->recv_seq, c->stage + pos, PS_WIRE_HDR_LEN);
			c->mac_pos = 0;
		} else if (c->rmac_on) {
			ps_mac_begin(&c->rmac, c->keys.recv, c->recv_seq);
			ps_mac_update(&c->rmac, c->stage + pos, PS_WIRE_HDR_LEN);
			c->mac_pos = 0;
		}
		pos += PS_WIRE_HDR_LEN;
		uint64_t len = c->hdr.meta_len + c->hdr.payload_len +
			       (c->rmac_on ? PS_MAC_TAG_LEN : 0);
		uint8_t *data, *body = ps_frame_body_alloc(c->hdr.meta_len, c->hdr.payload_len, &data);
		if (!body) {
			ps_error("closing connection from %s: out of memory for a %llu-byte frame",
				 c->base.peer, (unsigned long long)len);
			fail_rx(c, -ENOMEM);
			return 1;
		}
		size_t have = c->stage_fill - pos;
		size_t take = have < len ? have : (size_t)len;
		memcpy(data, c->stage + pos, take);
		pos += take;
		c->scan_pos = 0;
		c->scan_bad = 0;
		if (take == len) {
			if (deliver(c, body, data))
				return 1;
		} else {
			c->body = body;
			c->body_data = data;
			c->body_len = len;
			c->body_fill = take;
		}
	}
	if (pos) {
		memmove(c->stage, c->stage + pos, c->stage_fill - pos);
		c->stage_fill -= pos;
	}
	return 0;
}

static void read_frames(struct tcp_conn *c, ssize_t n)
{
	if (c->closing)
		return;
	if (c->rx_status) { /* recv_now found a bad frame and shut the socket */
		tcp_close(&c->base, c->rx_status);
		return;
	}
	if (n < 0) {
		if (n != UV_EOF)
			ps_info("connection %s: %s", c->base.peer, uv_strerror((int)n));
		tcp_close(&c->base, PS_ECLOSED);
		return;
	}
	if (n == 0)
		return;
	if (c->body) {
		c->body_fill += (uint64_t)n;
		scan_body(c, c->body_data, c->body_fill);
		if (c->body_fill < c->body_len)
			return;
		uint8_t *body = c->body;
		c->body = NULL;
		if (deliver(c, body, c->body_data))
			return;
		drain_stage(c);
		return;
	}
	c->stage_fill += (size_t)n;
	drain_stage(c);
}

/* Replies the handlers send while the frames of this read are delivered
 * gather in the outbox and leave together afterwards. */
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct tcp_conn *c = s->data;

	(void)buf;
	if (!c->loop_reading)
		lock_rx(c); /* an end reported without on_alloc */
	c->in_read = 1;
	read_frames(c, n);
	c->in_read = 0;
	c->loop_reading = 0;
	pthread_mutex_unlock(&c->rmu);
	flush_outbox(c);
}

static int tcp_recv_now(struct ps_conn *pc, ps_take_cb take, void *arg)
{
	struct tcp_conn *c = container_of(pc, struct tcp_conn, base);
	int fd, got;

	if (__atomic_load_n(&c->loop_waiting, __ATOMIC_RELAXED) || pthread_mutex_trylock(&c->rmu))
		return -EAGAIN; /* the loop thread is reading c, or about to */
	if (c->closing || c->rx_status || uv_fileno((uv_handle_t *)&c->handle, &fd)) {
		pthread_mutex_unlock(&c->rmu);
		return -EAGAIN;
	}
	c->take = take;
	c->take_arg = arg;
	c->ntaken = 0;
	for (;;) {
		uv_buf_t b;
		ssize_t n;

		rx_buf(c, &b);
		n = recv(fd, b.base, b.len, MSG_DONTWAIT);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			ps_info("connection %s: %s", c->base.peer, strerror(errno));
			fail_rx(c, PS_ECLOSED);
		}
		if (n <= 0)
			break; /* nothing now, or the end: the loop thread sees it too */
		read_frames(c, n);
		if (c->rx_status || (size_t)n < b.len)
			break;
	}
	got = c->ntaken;
	c->take = NULL;
	pthread_mutex_unlock(&c->rmu);
	return got;
}

static void set_peer_name(struct tcp_conn *c)
{
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	char host[64] = "?";
	int port = 0;

	if (uv_tcp_getpeername(&c->handle, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET) {
			uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
			port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
			port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		}
	}
	snprintf(c->base.peer, sizeof(c->base.peer), "%s:%d", host, port);
}

static void start_conn(struct tcp_conn *c)
{
	pthread_mutex_lock(&c->wmu);
	c->connected = 1;
	pthread_mutex_unlock(&c->wmu);
	uv_tcp_nodelay(&c->handle, 1);
	uv_read_start((uv_stream_t *)&c->handle, on_alloc, on_read);
}

static void reject_connection(struct tcp_transport *tt);

static void on_reject_closed(uv_handle_t *h)
{
	struct tcp_transport *tt = h->data;

	tt->rejecting = 0;
	if (tt->reject_again && !tt->destroying) {
		tt->reject_again = 0;
		reject_connection(tt);
	}
	maybe_finish_destroy(tt);
}

/* Accepts the connection the listener offers and closes it (the
 * handle is the transport's own: nothing to allocate). */
static void reject_connection(struct tcp_transport *tt)
{
	if (tt->rejecting) {
		tt->reject_again = 1; /* the handle is still closing */
		return;
	}
	tt->rejecting = 1;
	uv_tcp_init(tt->base.loop, &tt->reject);
	tt->reject.data = tt;
	(void)uv_accept((uv_stream_t *)&tt->listener, (uv_stream_t *)&tt->reject);
	uv_close((uv_handle_t *)&tt->reject, on_reject_closed);
}

static void on_new_connection(uv_stream_t *server, int status)
{
	struct tcp_transport *tt = server->data;
	struct tcp_conn *c;

	if (status < 0 || tt->destroying)
		return;
	c = conn_new(tt);
	if (!c) {
		/* not accepting it would leave the listener unwatched: no
		 * connection would ever be accepted again */
		ps_error("out of memory accepting a connection: it is closed");
		reject_connection(tt);
		return;
	}
	if (uv_accept(server, (uv_stream_t *)&c->handle) != 0) {
		tcp_close(&c->base, PS_ECLOSED);
		return;
	}
	set_peer_name(c);
	start_conn(c);
	if (tt->base.cbs.on_accept)
		tt->base.cbs.on_accept(&tt->base, &c->base);
}

static int tcp_create(uv_loop_t *loop, const struct ps_transport_cbs *cbs,
		      const struct ps_wire_limits *limits, void *data, struct ps_transport **out)
{
	struct tcp_transport *tt = calloc(1, sizeof(*tt));

	if (!tt)
		return -ENOMEM;
	tt->base.ops = &ps_tcp_transport_ops;
	tt->base.loop = loop;
	tt->base.cbs = *cbs;
	tt->base.limits = *limits;
	tt->base.data = data;
	*out = &tt->base;
	return 0;
}

static int tcp_listen(struct ps_transport *t, const char *host, int port)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
	struct sockaddr_storage ss;
	int rc;

	rc = ps_transport_resolve(host, port, &ss);
	if (rc)
		return rc;
	uv_tcp_init(t->loop, &tt->listener);
	tt->listener.data = tt;
	tt->listening = 1;
	rc = uv_tcp_bind(&tt->listener, (struct sockaddr *)&ss, 0);
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&tt->listener, 511, on_new_connection);
	return rc; /* libuv codes are -errno */
}

static int tcp_bound_port(struct ps_transport *t)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
	struct sockaddr_storage ss;
	int len = sizeof(ss);

	if (!tt->listening || uv_tcp_getsockname(&tt->listener, (struct sockaddr *)&ss, &len))
		return PS_ESTATE;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static int tcp_bound_addr(struct ps_transport *t, char *buf, size_t len)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
	struct sockaddr_storage ss;
	char ip[64];
	int n = sizeof(ss), rc;

	if (!tt->listening || uv_tcp_getsockname(&tt->listener, (struct sockaddr *)&ss, &n))
		return PS_ESTATE;
	if (ss.ss_family == AF_INET) {
		rc = uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
		n = snprintf(buf, len, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
	} else {
		rc = uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
		n = snprintf(buf, len, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
	}
	if (rc)
		return rc;
	return n < (int)len ? 0 : -ENAMETOOLONG;
}

static void on_connected(uv_connect_t *req, int status)
{
	struct tcp_conn *c = req->data;

	if (c->closing)
		return;
	if (status < 0) {
		if (c->base.t->cbs.on_connect)
			c->base.t->cbs.on_connect(&c->base, status);
		tcp_close(&c->base, status);
		return;
	}
	start_conn(c);
	if (c->base.t->cbs.on_connect)
		c->base.t->cbs.on_connect(&c->base, 0);
}

static int tcp_connect(struct ps_transport *t, const char *host, int port, void *data,
		       struct ps_conn **out)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);
	struct sockaddr_storage ss;
	struct tcp_conn *c;
	int rc;

	rc = ps_transport_resolve(host, port, &ss);
	if (rc)
		return rc;
	c = conn_new(tt);
	if (!c)
		return -ENOMEM;
	c->base.data = data;
	snprintf(c->base.peer, sizeof(c->base.peer), "%s:%d", host, port);
	c->connect_req.data = c;
	rc = uv_tcp_connect(&c->connect_req, &c->handle, (struct sockaddr *)&ss, on_connected);
	if (rc) {
		/* Close without on_close: the caller learns of it from rc. */
		conn_unlink(tt, c);
		c->closing = 1;
		uv_close((uv_handle_t *)&c->handle, on_handle_closed_quiet);
		return rc;
	}
	*out = &c->base;
	return 0;
}

static void on_written(uv_write_t *req, int status)
{
	struct tcp_write *w = container_of(req, struct tcp_write, req);

	struct tcp_conn *c = w->conn;
	struct tcp_transport *tt = tt_of(c);

	pthread_mutex_lock(&c->wmu);
	c->nwrites--;
	pthread_mutex_unlock(&c->wmu);
	if (status < 0 && status != UV_ECANCELED && !c->write_failed++)
		ps_info("connection %s: write: %s", c->base.peer, uv_strerror(status));
	if (w->cb)
		w->cb(&c->base, status < 0 ? PS_ECLOSED : 0, w->arg);
	write_free(w);
	if (!c->closing && queue_bounded(c))
		count_queue(c);
	if (tt->npaused)
		resume_paused(tt);
}

/* Writes bufs (total bytes) now as far as the socket takes them and queues
 * a copy of the rest: the VOLATILE contract. Called with wmu held. */
static int write_volatile(struct tcp_conn *c, struct tcp_write *w, uv_buf_t *bufs, int nbufs,
			  size_t total)
{
	int n = uv_try_write((uv_stream_t *)&c->handle, bufs, (unsigned)nbufs);
	size_t done = n > 0 ? (size_t)n : 0, off = 0, skip = done;
	uv_buf_t rest;

	if (n < 0 && n != UV_EAGAIN) {
		/* the peer reset or closed it (EPIPE, ECONNRESET): named here, as
		 * a failed read is; the caller closes with PS_ECLOSED */
		if (!c->write_failed++)
			ps_info("connection %s: write: %s", c->base.peer, uv_strerror(n));
		return PS_ECLOSED;
	}
	if (done == total) {
		write_free(w);
		return 0;
	}
	w->copy = malloc(total - done);
	if (!w->copy)
		return -ENOMEM;
	for (int i = 0; i < nbufs; i++) {
		size_t len = bufs[i].len;
		if (skip >= len) {
			skip -= len;
			continue;
		}
		memcpy(w->copy + off, bufs[i].base + skip, len - skip);
		off += len - skip;
		skip = 0;
	}
	rest = uv_buf_init((char *)w->copy, (unsigned)off);
	if (uv_write(&w->req, (uv_stream_t *)&c->handle, &rest, 1, on_written))
		return PS_ECLOSED;
	c->nwrites++;
	return 0;
}

/* Sends the replies gathered while frames of one read were handled, in
 * one system call (a push ack and a pull reply, typically). Under wmu;
 * 0 or a code for which the caller closes c once wmu is released. */
static int flush_outbox_locked(struct tcp_conn *c)
{
	struct tcp_write *w;
	uv_buf_t buf;
	int rc = -ENOMEM;

	if (!c->outbox_len)
		return 0;
	if (c->closing) {
		c->outbox_len = 0;
		return 0;
	}
	buf = uv_buf_init((char *)c->outbox, (unsigned)c->outbox_len);
	w = malloc(sizeof(*w));
	if (w) {
		*w = (struct tcp_write){ .conn = c };
		rc = write_volatile(c, w, &buf, 1, c->outbox_len);
		if (rc)
			write_free(w);
	}
	c->outbox_len = 0;
	return rc;
}

static void flush_outbox(struct tcp_conn *c)
{
	int rc;

	pthread_mutex_lock(&c->wmu);
	rc = flush_outbox_locked(c);
	pthread_mutex_unlock(&c->wmu);
	if (rc)
		tcp_close(&c->base, rc);
}

/* Appends a small volatile frame (bufs, the first one its header and
 * metadata) to the outbox; 0, or -1 when it does not fit (the caller
 * flushes and sends it itself). Under wmu. */
static int outbox_add(struct tcp_conn *c, const uv_buf_t *bufs, int nbufs, size_t total)
{
	if (c->outbox_len + total > OUTBOX_BYTES)
		return -1;
	if (!c->outbox && !(c->outbox = malloc(OUTBOX_BYTES)))
		return -1;
	for (int i = 0; i < nbufs; i++) {
		memcpy(c->outbox + c->outbox_len, bufs[i].base, bufs[i].len);
		c->outbox_len += bufs[i].len;
	}
	return 0;
}

/* Numbers a frame and encodes its header into head; on a keyed connection
 * also starts its tag over the header (and, with MACs, over the rest of
 * head: the metadata, head_len bytes in all). Returns 0 on a connection
 * without keys, 1 when the frame's metadata and payload go through
 * seal_update (folded into the MAC, or encrypted) and seal_end appends the
 * tag. The caller advances send_seq once the frame is committed. Under wmu. */
static int seal_begin(struct tcp_conn *c, struct ps_frame_hdr *h, uint8_t *head,
		      size_t head_len)
{
	if (c->keyed) {
		h->flags |= PS_FRAME_F_MAC | (c->cipher >= 0 ? PS_FRAME_F_ENC : 0);
		h->seq = (uint32_t)c->send_seq;
	}
	ps_wire_encode_hdr(head, h);
	if (!c->keyed)
		return 0;
	if (c->cipher >= 0) {
		ps_aead_begin(&c->saead, c->send_seq, head, PS_WIRE_HDR_LEN);
		return 1;
	}
	ps_mac_begin(&c->smac, c->keys.send, c->send_seq);
	ps_mac_update(&c->smac, head, head_len);
	return 1;
}

/* Folds n bytes of the frame being sealed into its tag; on an encrypted
 * connection encrypts them from in to out. Under wmu. */
static void seal_update(struct tcp_conn *c, uint8_t *out, const void *in, size_t n)
{
	if (c->cipher >= 0)
		ps_aead_update(&c->saead, out, in, n);
	else
		ps_mac_update(&c->smac, in, n);
}

static void seal_end(struct tcp_conn *c, uint8_t *tag)
{
	if (c->cipher >= 0)
		ps_aead_seal_end(&c->saead, tag);
	else
		ps_mac_end(&c->smac, tag);
}

/* An encrypted frame, whole, into out (header, metadata, payload pieces,
 * tag): the sender's bytes are never encrypted where they lie. Returns the
 * bytes written. Under wmu. */
static size_t seal_into(struct tcp_conn *c, struct ps_frame_hdr *h, uint8_t *out,
			const void *meta, uint32_t meta_len, const struct ps_iov *payload,
			int npayload)
{
	size_t off = PS_WIRE_HDR_LEN;

	seal_begin(c, h, out, PS_WIRE_HDR_LEN);
	seal_update(c, out + off, meta, meta_len);
	off += meta_len;
	for (int i = 0; i < npayload; i++) {
		seal_update(c, out + off, payload[i].base, payload[i].len);
		off += payload[i].len;
	}
	seal_end(c, out + off);
	return off + PS_MAC_TAG_LEN;
}

static int tcp_send(struct ps_conn *pc, uint8_t type, const void *meta, uint32_t meta_len,
		    const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		    void *arg)
{
	struct tcp_conn *c = container_of(pc, struct tcp_conn, base);
	struct ps_frame_hdr h = { .type = type, .meta_len = meta_len,
				  .flags = (uint16_t)(flags >> 16) };
	uv_buf_t bufs[MAX_IOV + 2];
	struct tcp_write *w;
	int nbufs = 1, rc;
	size_t total;

	if (c->closing || !c->connected)
		return PS_ECLOSED;
	struct ps_iov one;
	uint8_t *gathered = NULL;

	if ((flags & PS_SEND_VOLATILE) && cb)
		return -EINVAL;
	if (npayload > MAX_IOV) {
		/* more pieces than one write takes (a model of thousands of
		 * small tensors): copied into one buffer of the write's own */
		size_t n = 0;
		for (int i = 0; i < npayload; i++)
			n += payload[i].len;
		gathered = malloc(n ? n : 1);
		if (!gathered)
			return -ENOMEM;
		n = 0;
		for (int i = 0; i < npayload; i++) {
			memcpy(gathered + n, payload[i].base, payload[i].len);
			n += payload[i].len;
		}
		one = (struct ps_iov){ gathered, n };
		payload = &one;
		npayload = 1;
	}
	for (int i = 0; i < npayload; i++) {
		if (payload[i].len > UINT32_MAX) {
			free(gathered);
			return -EINVAL; /* uv_buf_t lengths are unsigned int */
		}
		h.payload_len += payload[i].len;
	}
	w = malloc(sizeof(*w) + PS_WIRE_HDR_LEN + meta_len);
	if (!w) {
		free(gathered);
		return -ENOMEM;
	}
	*w = (struct tcp_write){ .conn = c, .cb = cb, .arg = arg, .gathered = gathered };
	if (meta_len)
		memcpy(w->head + PS_WIRE_HDR_LEN, meta, meta_len);
	bufs[0] = uv_buf_init((char *)w->head, PS_WIRE_HDR_LEN + meta_len);
	for (int i = 0; i < npayload; i++)
		if (payload[i].len)
			bufs[nbufs++] = uv_buf_init((char *)payload[i].base, (unsigned)payload[i].len);
	total = PS_WIRE_HDR_LEN + meta_len + h.payload_len;

	pthread_mutex_lock(&c->wmu);
	if (c->keyed && c->cipher >= 0) {
		/* one buffer of its own, handed to libuv in pieces its unsigned
		 * lengths can hold */
		total += PS_MAC_TAG_LEN;
		w->sealed = malloc(total);
		if (!w->sealed) {
			rc = -ENOMEM;
			goto err_unlock;
		}
		seal_into(c, &h, w->sealed, meta, meta_len, payload, npayload);
		nbufs = 0;
		for (size_t off = 0; off < total; off += 1u << 30)
			bufs[nbufs++] = uv_buf_init((char *)w->sealed + off, (unsigned)(
				total - off < (1u << 30) ? total - off : (1u << 30)));
	} else if (seal_begin(c, &h, w->head, bufs[0].len)) {
		for (int i = 1; i < nbufs; i++)
			seal_update(c, NULL, bufs[i].base, bufs[i].len);
		seal_end(c, w->tag);
		bufs[nbufs++] = uv_buf_init((char *)w->tag, PS_MAC_TAG_LEN);
		total += PS_MAC_TAG_LEN;
	}
	if (c->in_read && (flags & PS_SEND_VOLATILE) && outbox_add(c, bufs, nbufs, total) == 0) {
		write_free(w);
		rc = 0;
		goto out_sent;
	}
	rc = flush_outbox_locked(c); /* frames leave in the order they were sent */
	if (!rc && c->closing)
		rc = PS_ECLOSED;
	if (rc)
		goto err_unlock;
	if (flags & PS_SEND_VOLATILE) {
		rc = write_volatile(c, w, bufs, nbufs, total);
	} else {
		rc = uv_write(&w->req, (uv_stream_t *)&c->handle, bufs, (unsigned)nbufs, on_written);
		if (rc)
			rc = PS_ECLOSED;
		else
			c->nwrites++;
	}
	if (rc)
		goto err_unlock;
out_sent:
	c->send_seq++;
	pthread_mutex_unlock(&c->wmu);
	__atomic_add_fetch(&c->base.bytes_out, total, __ATOMIC_RELAXED);
	if (queue_bounded(c))
		count_queue(c); /* bounded connections send on the loop thread only */
	return 0;

err_unlock:
	pthread_mutex_unlock(&c->wmu);
	write_free(w);
	tcp_close(pc, rc); /* no-op when already closing */
	return rc;
}

/* Writes what is left of a frame whose first bytes already went out, from
 * any thread: the stream would be corrupt if it stopped half way, so wait
 * for room (at most timeout_ms in all). 0, or -1 when the socket failed or
 * stayed full. */
static int finish_frame(int fd, struct iovec *iov, int n, size_t skip, int timeout_ms)
{
	uint64_t deadline = uv_hrtime() + (uint64_t)timeout_ms * 1000000u;

	for (;;) {
		while (n > 0 && skip >= iov[0].iov_len) {
			skip -= iov[0].iov_len;
			iov++;
			n--;
		}
		if (n == 0)
			return 0;
		iov[0].iov_base = (char *)iov[0].iov_base + skip;
		iov[0].iov_len -= skip;
		skip = 0; /* taken into iov[0]: a retry must not skip it again */
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
		ssize_t w = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w >= 0) {
			skip = (size_t)w;
			continue;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return -1;
		if (errno == EINTR)
			continue;
		uint64_t now = uv_hrtime();
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		if (now >= deadline ||
		    poll(&pfd, 1, (int)((deadline - now + 999999u) / 1000000u)) <= 0)
			return -1;
	}
}

static int tcp_send_now(struct ps_conn *pc, const struct ps_out_frame *f, int nf)
{
	struct tcp_conn *c = container_of(pc, struct tcp_conn, base);
	struct ps_frame_hdr h[PS_SEND_NOW_FRAMES];
	uint8_t head[PS_SEND_NOW_FRAMES][PS_WIRE_HDR_LEN];
	uint8_t tag[PS_SEND_NOW_FRAMES][PS_MAC_TAG_LEN];
	struct iovec iov[PS_SEND_NOW_IOV + 3 * PS_SEND_NOW_FRAMES];
	size_t total = 0;
	int n = 0, pieces = 0, fd, rc = -EAGAIN;
	uint8_t *sealed = NULL;
	ssize_t w;

	if (nf < 1 || nf > PS_SEND_NOW_FRAMES)
		return -EAGAIN;
	for (int i = 0; i < nf; i++) {
		h[i] = (struct ps_frame_hdr){ .type = f[i].type, .meta_len = f[i].meta_len,
					      .flags = (uint16_t)(f[i].flags >> 16) };
		pieces += f[i].npayload;
		if (pieces > PS_SEND_NOW_IOV)
			return -EAGAIN;
		for (int j = 0; j < f[i].npayload; j++)
			h[i].payload_len += f[i].payload[j].len;
		total += PS_WIRE_HDR_LEN + f[i].meta_len + h[i].payload_len;
		if (total > PS_SEND_NOW_MAX)
			return -EAGAIN;
	}

	pthread_mutex_lock(&c->wmu);
	if (c->closing || !c->connected || c->nwrites || c->outbox_len ||
	    uv_fileno((uv_handle_t *)&c->handle, &fd))
		goto out;
	/* Frame i is numbered send_seq + i: seal_begin numbers from send_seq,
	 * so advance it as frames are sealed and roll back if nothing leaves. */
	uint64_t seq0 = c->send_seq;
	if (c->keyed && c->cipher >= 0) {
		/* encrypted: the frames, sealed one after the other into one
		 * buffer of their own */
		sealed = malloc(total + (size_t)nf * PS_MAC_TAG_LEN);
		if (!sealed)
			goto out; /* the loop thread's send reports it */
		total = 0;
		for (int i = 0; i < nf; i++) {
			total += seal_into(c, &h[i], sealed + total, f[i].meta, f[i].meta_len,
					   f[i].payload, f[i].npayload);
			c->send_seq++;
		}
		iov[n++] = (struct iovec){ sealed, total };
	}
	for (int i = 0; i < nf && !sealed; i++) {
		int fi = n; /* frame i's first iovec, its header */
		iov[n++] = (struct iovec){ head[i], PS_WIRE_HDR_LEN };
		if (f[i].meta_len)
			iov[n++] = (struct iovec){ (void *)f[i].meta, f[i].meta_len };
		for (int j = 0; j < f[i].npayload; j++)
			if (f[i].payload[j].len)
				iov[n++] = (struct iovec){ (void *)f[i].payload[j].base,
							   f[i].payload[j].len };
		if (seal_begin(c, &h[i], head[i], PS_WIRE_HDR_LEN)) {
			for (int j = fi + 1; j < n; j++)
				seal_update(c, NULL, iov[j].iov_base, iov[j].iov_len);
			seal_end(c, tag[i]);
			iov[n++] = (struct iovec){ tag[i], PS_MAC_TAG_LEN };
			total += PS_MAC_TAG_LEN;
		}
		c->send_seq++;
	}
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
	w = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w <= 0) {
		c->send_seq = seq0;
		goto out; /* nothing written: the loop thread sends it (or sees the error) */
	}
	if ((size_t)w < total && finish_frame(fd, iov, n, (size_t)w, 5000)) {
		/* Half a frame is on the wire: the stream is unusable. shutdown()
		 * makes the loop thread see the connection end and close it. */
		shutdown(fd, SHUT_RDWR);
		rc = PS_ECLOSED;
		goto out;
	}
	__atomic_add_fetch(&c->base.bytes_out, total, __ATOMIC_RELAXED);
	rc = 0;
out:
	pthread_mutex_unlock(&c->wmu);
	free(sealed);
	return rc;
}

static void tcp_set_keys(struct ps_conn *pc, const struct ps_frame_keys *keys)
{
	struct tcp_conn *c = container_of(pc, struct tcp_conn, base);
	int rc = 0;

	pthread_mutex_lock(&c->wmu);
	c->keyed = keys != NULL;
	c->cipher = keys ? keys->cipher : -1;
	if (keys)
		c->keys = *keys;
	if (c->cipher >= 0) {
		rc = ps_aead_set_key(&c->saead, c->cipher, keys->send, 1);
		if (!rc)
			rc = ps_aead_set_key(&c->raead, c->cipher, keys->recv, 0);
	}
	c->send_seq = c->recv_seq = 0;
	pthread_mutex_unlock(&c->wmu);
	if (rc) {
		/* every tag would fail; say why instead */
		ps_error("closing connection %s: cannot set up %s: %s", c->base.peer,
			 ps_cipher_name(c->cipher), ps_strerror(rc));
		tcp_close(pc, rc);
	}
}

static void tcp_set_limits(struct ps_conn *pc, const struct ps_wire_limits *lim)
{
	container_of(pc, struct tcp_conn, base)->limits = *lim;
}

static size_t tcp_queued_bytes(struct ps_conn *pc)
{
	return uv_stream_get_write_queue_size(
		(uv_stream_t *)&container_of(pc, struct tcp_conn, base)->handle);
}

static void tcp_queue_stats(struct ps_transport *t, struct ps_queue_stats *out)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);

	*out = (struct ps_queue_stats){ tt->queued, tt->peak, tt->peak_total, tt->npaused };
}

static void on_listener_closed(uv_handle_t *h)
{
	struct tcp_transport *tt = h->data;

	tt->listening = 0;
	maybe_finish_destroy(tt);
}

static void maybe_finish_destroy(struct tcp_transport *tt)
{
	if (tt->destroying == 1 && tt->nconns == 0 && !tt->listening && !tt->rejecting) {
		tt->destroying = 2;
		free(tt);
	}
}

static void tcp_destroy(struct ps_transport *t)
{
	struct tcp_transport *tt = container_of(t, struct tcp_transport, base);

	if (tt->destroying)
		return;
	tt->destroying = 1;
	for (struct tcp_conn *c = tt->conns; c; c = c->next)
		tcp_close(&c->base, 0);
	if (tt->listening)
		uv_close((uv_handle_t *)&tt->listener, on_listener_closed);
	else
		maybe_finish_destroy(tt);
}

const struct ps_transport_ops ps_tcp_transport_ops = {
	.name = "tcp",
	.create = tcp_create,
	.listen = tcp_listen,
	.bound_port = tcp_bound_port,
	.bound_addr = tcp_bound_addr,
	.connect = tcp_connect,
	.send = tcp_send,
	.send_now = tcp_send_now,
	.recv_now = tcp_recv_now,
	.set_keys = tcp_set_keys,
	.set_limits = tcp_set_limits,
	.queued_bytes = tcp_queued_bytes,
	.queue_stats = tcp_queue_stats,
	.close = tcp_close,
	.destroy = tcp_destroy,
};
