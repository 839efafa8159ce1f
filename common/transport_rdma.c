/* transport_rdma.c - `transport: rdma`: frames over reliable-connected
 * verbs queue pairs set up with rdma_cm (docs/rdma.md).
 *
 * Every connection has its own protection domain, completion queue and
 * completion channel; the channel's fd is watched with uv_poll_t, and each
 * event is acknowledged, the CQ re-armed and then drained. One rdma_cm
 * event channel per transport (listener and outgoing connections) is
 * watched the same way. Everything runs on the loop thread (no send_now,
 * no recv_now).
 *
 * Messages. Each end posts NRECV receive buffers of SLOT_BYTES (the pool
 * of rdma_proto.c, registered for local writes only) and may have at most
 * that many messages outstanding toward the peer (credits, rdma_proto.h).
 * Every message carries 32 bits of immediate data: its kind (4 bits), the
 * credits it returns (12 bits) and a write id (16 bits).
 *   FRAME   a whole wire frame (header, metadata, payload, MAC) that fits
 *           one buffer; the receiver copies it out and re-posts the buffer
 *   CREDIT  nothing but the credits (when half are owed and nothing else
 *           goes, and as the keepalive of an idle connection)
 *   WREQ    the 24-byte header of a frame too big for a buffer
 *   WGRANT  the receiver's answer: address, rkey and length of a buffer it
 *           allocated and registered for exactly that frame (remote write
 *           only), after checking the header against its limits and keys
 *   WDONE   RDMA write with immediate of the frame's bytes after the header
 *           into that buffer; its completion hands the frame on, in place
 * Frames leave in the order they were sent: a big frame holds the frames
 * behind it until its write is posted (RC keeps the order from there).
 * Grants and credit messages do not wait behind data, so two ends that
 * both send big frames cannot block each other.
 *
 * Frames are sealed (numbered, MACed or encrypted: frame_mac.h,
 * frame_aead.h) when send is called, as on TCP, into a send buffer or a
 * buffer of their own; the receiver checks the header before it allocates
 * anything and the tag before it hands a frame on. No rkey leaves the
 * process before a frame header passes the connection's checks, and
 * before authentication the handshake limits keep every frame small
 * enough to go by send, so an unauthenticated peer never gets one.
 *
 * A peer that breaks these rules (an unknown kind, a credit it was never
 * owed, a write nobody granted or of another length, a grant for no
 * request) closes that connection with the reason logged; a peer that dies
 * is seen as an rdma_cm DISCONNECTED event or a failed work completion.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sodium.h>
#include "finite.h"
#include "frame_aead.h"
#include "frame_mac.h"
#include "ps_err.h"
#include "ps_log.h"
#include "rdma_proto.h"
#include "transport.h"
#include "transport_rdma.h"

#define SLOT_BYTES (16 * 1024)  /* one buffer; frames up to this go by send */
#define NRECV 32                /* receive buffers per connection: the credits */
#define NSEND 48                /* send buffers per connection */
#define MAX_CHUNKS 32           /* RDMA writes one big frame may take */
#define KEEPALIVE_MS 1000       /* an idle connection sends a CREDIT this often */
#define RESOLVE_MS 5000         /* rdma_resolve_addr / _route timeouts */
#define LINGER_MS 500           /* a closing connection waits this long for its sends */

enum kind { K_FRAME = 1, K_CREDIT, K_WREQ, K_WGRANT, K_WDONE };
enum wr { WR_RECV = 1, WR_SEND, WR_WRITE };

/* K_WREQ's body: the frame's header, then the bytes per RDMA write
 * (uint32, little-endian) */
#define WREQ_LEN (PS_WIRE_HDR_LEN + 4)

struct wgrant { /* K_WGRANT's body, little-endian */
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct rdma_transport {
	struct ps_transport base;
	struct rdma_event_channel *ec;
	uv_poll_t ec_poll;
	uv_timer_t keepalive;
	struct rdma_cm_id *listener;
	int destroying;
	int nconns;
	int nhandles;             /* ec_poll and keepalive not yet closed */
	struct rdma_conn *conns;
	uint64_t queued, peak, peak_total;
	int npaused;
};

/* A frame to send, sealed when send was called. */
struct out {
	struct out *next;
	ps_send_cb cb;
	void *arg;
	uint8_t *buf;             /* the frame, header to tag (a send slot, or malloc'd) */
	int slot;                 /* buf is send slot slot, or -1 */
	size_t len;
	int big;                  /* goes by WREQ / WGRANT / write */
	int state;                /* big: 0 ready, 1 waiting for the grant, 2 granted */
	uint16_t id;
	uint64_t raddr;
	uint32_t rkey;
	struct ibv_mr *mr;        /* big: buf registered */
	int32_t test_delta;       /* ps_rdma_test_write_delta */
};

struct rdma_conn {
	struct ps_conn base;
	struct rdma_cm_id *id;
	struct rdma_conn *prev, *next;
	struct ps_wire_limits limits;
	int passive;              /* accepted (on_accept), else connected (on_connect) */
	int established;
	int announced;            /* on_accept / on_connect(0) delivered: on_close owed */
	int closing, close_status;
	int nhandles;             /* uv handles not yet closed after closing */
	int lingering;            /* closing, waiting for posted sends (LINGER_MS) */
	int nposted;              /* signaled sends and writes not completed */
	uv_timer_t defer;         /* closes go through it (never inside the call) */
	uv_poll_t cq_poll;
	int cq_poll_on;
	/* verbs */
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int qp_on;
	struct ps_rdma_pool rpool, spool;
	struct ibv_mr *rmr, *smr;
	struct out *sowner[NSEND];
	uint64_t max_msg;
	struct ps_rdma_credits cr;
	int paused;               /* backpressure: credits held back */
	uint64_t last_send_ms;
	/* sending */
	struct out *q_head, *q_tail;      /* not yet posted, in order */
	struct out *w_head, *w_tail;      /* big frames written, awaiting completion */
	size_t queued;
	size_t q_counted;
	uint16_t next_wid;
	int grant_due;            /* a WGRANT for rw must go */
	/* the big frame being received (one at a time) */
	struct {
		int active;
		uint16_t id;
		struct ps_frame_hdr hdr;
		uint8_t hdr_bytes[PS_WIRE_HDR_LEN];
		uint8_t *body, *data;
		uint64_t len;
		uint32_t last;    /* bytes of its last RDMA write (the one with the immediate) */
		struct ibv_mr *mr;
	} rw;
	/* authentication (set_keys) */
	int keyed, cipher;
	struct ps_frame_keys keys;
	uint64_t send_seq, recv_seq;
	struct ps_mac smac, rmac;
	struct ps_aead saead, raead;
	/* tests (ps_rdma_test_write_delta): the next big frame's write */
	int32_t test_write_delta;
};

static struct rdma_transport *rt_of(struct rdma_conn *c)
{
	return container_of(c->base.t, struct rdma_transport, base);
}

static void rt_close(struct ps_conn *pc, int status);
static void progress(struct rdma_conn *c);

/* ---- the probe ---- */

int ps_rdma_probe(const char *device, char *why, size_t whylen)
{
	struct ibv_device **list;
	int n = 0, found = 0, len = 0;
	char names[200] = "";

	errno = 0;
	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		int e = errno;
		snprintf(why, whylen, "no RDMA device found (%s%s); use transport: tcp, or load an "
			 "HCA driver, or soft-RoCE (rdma link add rxe0 type rxe netdev IFACE)",
			 !list && e == ENOSYS ? "this kernel has no RDMA support: "
			 "ibv_get_device_list: " : "",
			 !list ? strerror(e) : "ibv_get_device_list returned none");
		if (list)
			ibv_free_device_list(list);
		return PS_ENOTSUP;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		if (device && device[0] && name && strcmp(name, device) == 0)
			found = 1;
		if (len < (int)sizeof(names))
			len += snprintf(names + len, sizeof(names) - (size_t)len, "%s%s",
					i ? ", " : "", name ? name : "?");
	}
	ibv_free_device_list(list);
	if (device && device[0] && !found) {
		snprintf(why, whylen, "RDMA device '%s' not found (rdma.device); this machine has: "
			 "%s; or use transport: tcp", device, names);
		return PS_ENOTSUP;
	}
	snprintf(why, whylen, "devices here: %s", names);
	return 0;
}

/* ---- connections: creation and teardown ---- */

static void conn_unlink(struct rdma_transport *rt, struct rdma_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else if (rt->conns == c)
		rt->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	rt->nconns--;
}

static struct rdma_conn *conn_new(struct rdma_transport *rt)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->cipher = -1;
	if (ps_mac_init(&c->smac) || ps_mac_init(&c->rmac) || ps_aead_init(&c->saead) ||
	    ps_aead_init(&c->raead)) {
		ps_mac_free(&c->smac);
		ps_mac_free(&c->rmac);
		ps_aead_free(&c->saead);
		ps_aead_free(&c->raead);
		free(c);
		return NULL;
	}
	c->base.t = &rt->base;
	c->limits = rt->base.limits;
	uv_timer_init(rt->base.loop, &c->defer);
	c->defer.data = c;
	c->next = rt->conns;
	if (rt->conns)
		rt->conns->prev = c;
	rt->conns = c;
	rt->nconns++;
	return c;
}

static void out_free(struct out *o)
{
	if (o->mr)
		ibv_dereg_mr(o->mr);
	if (o->slot < 0)
		free(o->buf);
	free(o);
}

/* Fails the sends of list (cb with PS_ECLOSED) and frees them. */
static void fail_outs(struct rdma_conn *c, struct out *list)
{
	while (list) {
		struct out *o = list;
		list = o->next;
		if (o->cb)
			o->cb(&c->base, PS_ECLOSED, o->arg);
		out_free(o);
	}
}

static void maybe_finish_destroy(struct rdma_transport *rt);

/* The verbs objects of c, in the order they depend on each other. */
static void verbs_free(struct rdma_conn *c)
{
	if (c->qp_on)
		rdma_destroy_qp(c->id);
	c->qp_on = 0;
	if (c->rw.mr)
		ibv_dereg_mr(c->rw.mr);
	free(c->rw.body);
	memset(&c->rw, 0, sizeof(c->rw));
	if (c->rmr)
		ibv_dereg_mr(c->rmr);
	if (c->smr)
		ibv_dereg_mr(c->smr);
	c->rmr = c->smr = NULL;
	for (int i = 0; i < NSEND; i++)
		c->sowner[i] = NULL; /* freed by the caller's fail_outs */
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->ch)
		ibv_destroy_comp_channel(c->ch);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	c->cq = NULL;
	c->ch = NULL;
	c->pd = NULL;
	ps_rdma_pool_free(&c->rpool);
	ps_rdma_pool_free(&c->spool);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
	struct rdma_conn *c = h->data;
	struct rdma_transport *rt = rt_of(c);
	struct out *owned = NULL;

	if (--c->nhandles > 0)
		return;
	if (c->qp_on) /* no work request may touch the buffers freed below */
		rdma_destroy_qp(c->id);
	c->qp_on = 0;
	/* Sends in flight first (their slots), then the queues, in order. */
	for (int i = 0; i < NSEND; i++)
		if (c->sowner[i]) {
			c->sowner[i]->next = owned;
			owned = c->sowner[i];
			c->sowner[i] = NULL;
		}
	fail_outs(c, owned);
	fail_outs(c, c->w_head);
	fail_outs(c, c->q_head);
	c->w_head = c->q_head = NULL;
	rt->queued -= c->q_counted;
	if (c->paused)
		rt->npaused--;
	conn_unlink(rt, c);
	if (c->announced && rt->base.cbs.on_close)
		rt->base.cbs.on_close(&c->base, c->close_status);
	verbs_free(c);
	if (c->id)
		rdma_destroy_id(c->id);
	sodium_memzero(&c->keys, sizeof(c->keys));
	ps_mac_free(&c->smac);
	ps_mac_free(&c->rmac);
	ps_aead_free(&c->saead);
	ps_aead_free(&c->raead);
	free(c);
	maybe_finish_destroy(rt);
}

static void finish_close(struct rdma_conn *c);

static void on_linger_timeout(uv_timer_t *t)
{
	finish_close(t->data);
}

/* Closes c: nothing more is posted or handed on; sends already posted
 * get up to LINGER_MS to complete (an error reply sent just before a close
 * reaches the peer, as on TCP); then the peer is told (rdma_disconnect),
 * and once the loop has closed c's handles the pending sends fail,
 * on_close fires (for a connection the owner was told of) and the verbs
 * objects go. */
static void rt_close(struct ps_conn *pc, int status)
{
	struct rdma_conn *c = container_of(pc, struct rdma_conn, base);

	if (c->closing)
		return;
	c->closing = 1;
	c->close_status = status;
	if (c->established && c->cq_poll_on && c->nposted > 0) {
		c->lingering = 1;
		uv_timer_start(&c->defer, on_linger_timeout, LINGER_MS, 0);
		return;
	}
	finish_close(c);
}

static void finish_close(struct rdma_conn *c)
{
	if (c->nhandles)
		return; /* already going */
	c->lingering = 0;
	uv_timer_stop(&c->defer);
	if (c->established)
		rdma_disconnect(c->id);
	c->nhandles = 1;
	uv_close((uv_handle_t *)&c->defer, on_conn_handle_closed);
	if (c->cq_poll_on) {
		c->nhandles++;
		uv_close((uv_handle_t *)&c->cq_poll, on_conn_handle_closed);
	}
}

/* A protocol error by the peer: logged, c closed. Returns 1. */
static int conn_fail(struct rdma_conn *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int conn_fail(struct rdma_conn *c, int code, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	ps_warn("closing rdma connection %s: %s", c->base.peer, why);
	rt_close(&c->base, code);
	return 1;
}

static void set_peer_name(struct rdma_conn *c)
{
	struct sockaddr *sa = rdma_get_peer_addr(c->id);
	char host[64] = "?";
	int port = 0;

	if (sa && sa->sa_family == AF_INET) {
		uv_ip4_name((struct sockaddr_in *)sa, host, sizeof(host));
		port = ntohs(((struct sockaddr_in *)sa)->sin_port);
	} else if (sa && sa->sa_family == AF_INET6) {
		uv_ip6_name((struct sockaddr_in6 *)sa, host, sizeof(host));
		port = ntohs(((struct sockaddr_in6 *)sa)->sin6_port);
	}
	snprintf(c->base.peer, sizeof(c->base.peer), "%s:%d", host, port);
}

/* ---- posting ---- */

/* Whether c holds back the credits it owes (backpressure). Never while a
 * big frame of its own waits for the peer's grant: the peer needs a credit
 * to grant it, and c's queue only shrinks once it has. */
static int withholding(const struct rdma_conn *c)
{
	return c->paused && !(c->q_head && c->q_head->big && c->q_head->state == 1);
}

static uint32_t imm_make(struct rdma_conn *c, int kind, uint32_t id)
{
	uint32_t give = withholding(c) ? 0 : ps_rdma_credit_collect(&c->cr);

	return htonl(((uint32_t)kind << 28) | ((give & 0xfff) << 16) | (id & 0xffff));
}

static int post_recv(struct rdma_conn *c, uint32_t i)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(c->rpool.base + (size_t)i * c->rpool.slot),
			       .length = (uint32_t)c->rpool.slot, .lkey = c->rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = ((uint64_t)WR_RECV << 32) | i, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	return ibv_post_recv(c->id->qp, &wr, &bad) ? PS_ECLOSED : 0;
}

/* Sends len bytes of send buffer buf (owner's callback fires on its
 * completion) as a message of kind; the caller took the credit. */
static int post_send(struct rdma_conn *c, int kind, uint32_t id, uint8_t *buf, uint32_t len,
		     struct out *owner)
{
	int64_t slot = ps_rdma_pool_index(&c->spool, buf);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = c->smr->lkey };
	struct ibv_send_wr wr = { .wr_id = ((uint64_t)WR_SEND << 32) | (uint64_t)slot,
				  .sg_list = &sge, .num_sge = len ? 1 : 0,
				  .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	int rc;

	wr.imm_data = imm_make(c, kind, id);
	c->sowner[slot] = owner;
	rc = ibv_post_send(c->id->qp, &wr, &bad);
	if (rc) /* owner stays in sowner: the close fails its callback */
		return conn_fail(c, PS_ECLOSED, "ibv_post_send: %s", strerror(rc)) ? PS_ECLOSED : 0;
	c->nposted++;
	c->last_send_ms = uv_now(c->base.t->loop);
	return 0;
}

/* A control message (kind with body, at most a slot) if a send buffer and
 * a credit (update: the reserved one too) are free: 0 sent, 1 not now,
 * negative when c closed. */
static int send_ctrl(struct rdma_conn *c, int kind, uint32_t id, const void *body, uint32_t len,
		     int update)
{
	uint8_t *buf;

	if (!c->spool.nfree || !ps_rdma_credit_take(&c->cr, update))
		return 1;
	buf = ps_rdma_pool_get(&c->spool);
	if (len)
		memcpy(buf, body, len);
	return post_send(c, kind, id, buf, len, NULL);
}

/* The bytes per RDMA write for a frame body of len bytes: the port's
 * largest message (send refuses frames that would need more than
 * MAX_CHUNKS of them). */
static uint64_t write_chunk(const struct rdma_conn *c, uint64_t len)
{
	uint64_t chunk = c->max_msg;

	while ((len + chunk - 1) / chunk > MAX_CHUNKS)
		chunk *= 2; /* not with what send lets through */
	return chunk;
}

/* The RDMA write of a granted big frame, after its header, in chunks of
 * the size its request announced; the last one carries the immediate
 * (whose completion tells the receiver that chunk's length only). */
static int post_write(struct rdma_conn *c, struct out *o)
{
	uint64_t len = o->len - PS_WIRE_HDR_LEN + (uint64_t)(int64_t)o->test_delta;
	uint64_t chunk = write_chunk(c, o->len - PS_WIRE_HDR_LEN), off = 0;
	struct ibv_send_wr wr[MAX_CHUNKS + 1], *bad;
	struct ibv_sge sge[MAX_CHUNKS + 1];
	int n = 0, rc;
	while (off < len) {
		uint64_t part = len - off < chunk ? len - off : chunk;
		sge[n] = (struct ibv_sge){ .addr = (uintptr_t)o->buf + PS_WIRE_HDR_LEN + off,
					   .length = (uint32_t)part, .lkey = o->mr->lkey };
		wr[n] = (struct ibv_send_wr){ .sg_list = &sge[n], .num_sge = 1,
					      .opcode = IBV_WR_RDMA_WRITE };
		wr[n].wr.rdma.remote_addr = o->raddr + off;
		wr[n].wr.rdma.rkey = o->rkey;
		if (n)
			wr[n - 1].next = &wr[n];
		off += part;
		n++;
	}
	wr[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr[n - 1].send_flags = IBV_SEND_SIGNALED;
	wr[n - 1].wr_id = (uint64_t)WR_WRITE << 32;
	wr[n - 1].imm_data = imm_make(c, K_WDONE, o->id);
	ps_debug("rdma %s: write %u: %llu bytes in %d writes", c->base.peer, o->id,
		 (unsigned long long)len, n);
	rc = ibv_post_send(c->id->qp, wr, &bad);
	if (rc)
		return conn_fail(c, PS_ECLOSED, "ibv_post_send (RDMA write): %s", strerror(rc)) ?
		       PS_ECLOSED : 0;
	c->nposted++;
	c->last_send_ms = uv_now(c->base.t->loop);
	return 0;
}

/* ---- backpressure ---- */

static int queue_bounded(struct rdma_conn *c)
{
	return c->limits.max_queue || rt_of(c)->base.limits.max_queue_total;
}

/* Recounts c's queue into the transport's total and holds back (or gives
 * again) the credits c returns: a peer that does not take what it asked
 * for runs out of credits instead of growing this queue. */
static void count_queue(struct rdma_conn *c)
{
	struct rdma_transport *rt = rt_of(c);
	uint64_t total = rt->base.limits.max_queue_total;

	rt->queued = rt->queued - c->q_counted + c->queued;
	c->q_counted = c->queued;
	if (c->queued > rt->peak)
		rt->peak = c->queued;
	if (rt->queued > rt->peak_total)
		rt->peak_total = rt->queued;
	if (!queue_bounded(c))
		return;
	if (!c->paused && ((c->limits.max_queue && c->queued > c->limits.max_queue) ||
			   (total && rt->queued > total))) {
		c->paused = 1;
		rt->npaused++;
	} else if (c->paused && (!c->limits.max_queue || c->queued <= c->limits.max_queue / 2) &&
		   (!total || rt->queued <= total - total / 4)) {
		c->paused = 0;
		rt->npaused--;
	}
}

/* The queues shrank: connections paused by the bound on every connection
 * together that are back under it return the credits they owe now. */
static void resume_paused(struct rdma_transport *rt, struct rdma_conn *except)
{
	for (struct rdma_conn *p = rt->conns; p && rt->npaused; p = p->next) {
		if (p == except || !p->paused || p->closing || !p->established)
			continue;
		count_queue(p);
		if (!p->paused && ps_rdma_credit_update_due(&p->cr))
			send_ctrl(p, K_CREDIT, 0, NULL, 0, 1);
	}
}

/* Posts what can go now: the grant, the frames in order, a credit
 * message when enough is owed. */
static void progress(struct rdma_conn *c)
{
	int rc;

	if (!c->established || c->closing)
		return;
	if (c->grant_due) {
		struct wgrant g = { .addr = htole64((uintptr_t)c->rw.data),
				    .rkey = htole32(c->rw.mr->rkey), .len = htole32((uint32_t)c->rw.len) };
		rc = send_ctrl(c, K_WGRANT, c->rw.id, &g, sizeof(g), 0);
		if (rc < 0)
			return;
		if (rc == 0)
			c->grant_due = 0;
	}
	while (c->q_head) {
		struct out *o = c->q_head;

		if (o->big && o->state == 1)
			break; /* waiting for the grant */
		if (!ps_rdma_credit_take(&c->cr, 0))
			break;
		if (!o->big) {
			if (o->slot < 0) {
				uint8_t *buf = ps_rdma_pool_get(&c->spool);
				if (!buf) {
					c->cr.avail++; /* not taken after all */
					break;
				}
				memcpy(buf, o->buf, o->len);
				free(o->buf);
				o->buf = buf;
				o->slot = (int)ps_rdma_pool_index(&c->spool, buf);
			}
			c->q_head = o->next;
			c->queued -= o->len;
			if (post_send(c, K_FRAME, 0, o->buf, (uint32_t)o->len, o))
				return;
		} else if (o->state == 0) {
			if (!c->spool.nfree) {
				c->cr.avail++;
				break;
			}
			if (!o->mr && !(o->mr = ibv_reg_mr(c->pd, o->buf, o->len + (o->test_delta > 0 ?
						(size_t)o->test_delta : 0), 0))) {
				conn_fail(c, -errno, "ibv_reg_mr of a %zu-byte frame: %s", o->len,
					  strerror(errno));
				return;
			}
			o->id = c->next_wid++;
			o->state = 1;
			uint8_t *buf = ps_rdma_pool_get(&c->spool);
			uint32_t chunk = (uint32_t)write_chunk(c, o->len - PS_WIRE_HDR_LEN);
			memcpy(buf, o->buf, PS_WIRE_HDR_LEN);
			chunk = htole32(chunk);
			memcpy(buf + PS_WIRE_HDR_LEN, &chunk, sizeof(chunk));
			ps_debug("rdma %s: write %u: asking for %zu bytes", c->base.peer, o->id, o->len);
			if (post_send(c, K_WREQ, o->id, buf, WREQ_LEN, NULL))
				return;
			break;
		} else { /* granted */
			c->q_head = o->next;
			c->queued -= o->len;
			o->next = NULL;
			if (c->w_tail)
				c->w_tail->next = o;
			else
				c->w_head = o;
			c->w_tail = o;
			if (post_write(c, o))
				return;
		}
	}
	if (!c->q_head)
		c->q_tail = NULL;
	if (queue_bounded(c) || c->q_counted)
		count_queue(c);
	if (!withholding(c) && ps_rdma_credit_update_due(&c->cr))
		send_ctrl(c, K_CREDIT, 0, NULL, 0, 1);
	if (rt_of(c)->npaused)
		resume_paused(rt_of(c), c);
}

/* ---- receiving ---- */

static void frame_free(struct ps_frame *f)
{
	free(f);
}

/* Checks a received header (limits, keys): 0 or the code, c closed. */
static int rx_check_hdr(struct rdma_conn *c, const uint8_t *bytes, struct ps_frame_hdr *h)
{
	char why[200];
	int rc = ps_wire_decode_hdr(bytes, &c->limits, h, why, sizeof(why));

	if (!rc)
		rc = ps_frame_check_auth(h, c->keyed, c->cipher, c->recv_seq, why, sizeof(why));
	if (rc)
		conn_fail(c, rc, "%s", why);
	return rc;
}

/* A whole frame in body (data: its metadata, then payload and tag, in
 * place): tag checked (and decrypted), payload scanned, handed on. */
static int rx_deliver(struct rdma_conn *c, const struct ps_frame_hdr *h, const uint8_t *hdr_bytes,
		      uint8_t *body, uint8_t *data)
{
	struct ps_frame *f = (struct ps_frame *)body;
	uint64_t len = h->meta_len + h->payload_len;

	if (h->flags & PS_FRAME_F_MAC) {
		int bad;
		if (c->cipher >= 0) {
			ps_aead_begin(&c->raead, c->recv_seq, hdr_bytes, PS_WIRE_HDR_LEN);
			ps_aead_update(&c->raead, data, data, (size_t)len);
			bad = ps_aead_open_end(&c->raead, data + len);
		} else {
			ps_mac_begin(&c->rmac, c->keys.recv, c->recv_seq);
			ps_mac_update(&c->rmac, hdr_bytes, PS_WIRE_HDR_LEN);
			ps_mac_update(&c->rmac, data, (size_t)len);
			bad = ps_mac_verify(&c->rmac, data + len);
		}
		if (bad) {
			free(body);
			return conn_fail(c, PS_EAUTH, "%s frame %llu failed its MAC (altered on the "
					 "way, or sent under another key)", ps_wire_type_name(h->type),
					 (unsigned long long)c->recv_seq);
		}
		c->recv_seq++;
		c->base.bytes_in += PS_MAC_TAG_LEN;
	}
	f->hdr = *h;
	f->meta = data;
	f->payload = data + h->meta_len;
	f->payload_finite = ps_words_finite(f->payload, (size_t)(h->payload_len / 4));
	f->release = frame_free;
	c->base.bytes_in += PS_WIRE_HDR_LEN + len;
	c->base.t->cbs.on_frame(&c->base, f);
	return c->closing;
}

static uint64_t frame_len(const struct ps_frame_hdr *h)
{
	return (uint64_t)h->meta_len + h->payload_len +
	       ((h->flags & PS_FRAME_F_MAC) ? PS_MAC_TAG_LEN : 0);
}

static int rx_frame(struct rdma_conn *c, const uint8_t *p, uint32_t n)
{
	struct ps_frame_hdr h;
	uint8_t *body, *data;

	if (n < PS_WIRE_HDR_LEN)
		return conn_fail(c, PS_EPROTO, "a %u-byte frame message, shorter than a header", n);
	if (rx_check_hdr(c, p, &h))
		return 1;
	if (frame_len(&h) != n - PS_WIRE_HDR_LEN)
		return conn_fail(c, PS_EPROTO, "%s frame message of %u bytes where its header "
				 "says %llu", ps_wire_type_name(h.type), n,
				 (unsigned long long)(frame_len(&h) + PS_WIRE_HDR_LEN));
	body = ps_frame_body_alloc(h.meta_len, h.payload_len, &data);
	if (!body)
		return conn_fail(c, -ENOMEM, "out of memory for a %u-byte frame", n);
	memcpy(data, p + PS_WIRE_HDR_LEN, n - PS_WIRE_HDR_LEN);
	return rx_deliver(c, &h, p, body, data);
}

/* A big frame announced: checked like any header, then a buffer for it
 * registered for remote writes and a grant queued. */
static int rx_wreq(struct rdma_conn *c, uint16_t id, const uint8_t *p, uint32_t n)
{
	struct ps_frame_hdr h;
	uint64_t len;
	uint32_t chunk;

	if (c->rw.active)
		return conn_fail(c, PS_EPROTO, "a second big frame announced while write %u is "
				 "still due", c->rw.id);
	if (n != WREQ_LEN)
		return conn_fail(c, PS_EPROTO, "a %u-byte write request (%d expected)", n, WREQ_LEN);
	if (rx_check_hdr(c, p, &h))
		return 1;
	len = frame_len(&h);
	memcpy(&chunk, p + PS_WIRE_HDR_LEN, sizeof(chunk));
	chunk = le32toh(chunk);
	if (len == 0 || len > UINT32_MAX)
		return conn_fail(c, PS_EPROTO, "a write request for %llu bytes",
				 (unsigned long long)len);
	if (chunk == 0 || (len + chunk - 1) / chunk > MAX_CHUNKS)
		return conn_fail(c, PS_EPROTO, "a write request for %llu bytes in %u-byte writes",
				 (unsigned long long)len, chunk);
	c->rw.body = ps_frame_body_alloc(h.meta_len, h.payload_len, &c->rw.data);
	if (!c->rw.body)
		return conn_fail(c, -ENOMEM, "out of memory for a %llu-byte frame",
				 (unsigned long long)len);
	c->rw.mr = ibv_reg_mr(c->pd, c->rw.data, len,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->rw.mr)
		return conn_fail(c, -errno, "ibv_reg_mr of a %llu-byte frame: %s",
				 (unsigned long long)len, strerror(errno));
	c->rw.active = 1;
	c->rw.id = id;
	c->rw.hdr = h;
	c->rw.len = len;
	c->rw.last = (uint32_t)((len - 1) % chunk + 1);
	memcpy(c->rw.hdr_bytes, p, PS_WIRE_HDR_LEN);
	c->grant_due = 1;
	ps_debug("rdma %s: write %u: %llu bytes granted", c->base.peer, id, (unsigned long long)len);
	return 0;
}

static int rx_wgrant(struct rdma_conn *c, uint16_t id, const uint8_t *p, uint32_t n)
{
	struct out *o = c->q_head;
	struct wgrant g;

	if (n != sizeof(g))
		return conn_fail(c, PS_EPROTO, "a %u-byte write grant", n);
	memcpy(&g, p, sizeof(g));
	g.addr = le64toh(g.addr);
	g.rkey = le32toh(g.rkey);
	g.len = le32toh(g.len);
	if (!o || !o->big || o->state != 1 || o->id != id)
		return conn_fail(c, PS_EPROTO, "a write grant (id %u) for no request", id);
	if (g.len != o->len - PS_WIRE_HDR_LEN)
		return conn_fail(c, PS_EPROTO, "a write grant of %u bytes for a %zu-byte frame",
				 g.len, o->len - PS_WIRE_HDR_LEN);
	o->raddr = g.addr;
	o->rkey = g.rkey;
	o->state = 2;
	return 0;
}

static int rx_wdone(struct rdma_conn *c, uint16_t id, uint32_t n)
{
	uint8_t *body = c->rw.body;

	if (!c->rw.active || c->grant_due || c->rw.id != id)
		return conn_fail(c, PS_EPROTO, "an RDMA write (id %u) nobody granted", id);
	if (n != c->rw.last)
		return conn_fail(c, PS_EPROTO, "an RDMA write ending with %u bytes where %u were due "
				 "(%llu granted)", n, c->rw.last, (unsigned long long)c->rw.len);
	ps_debug("rdma %s: write %u: %u bytes arrived", c->base.peer, id, n);
	ibv_dereg_mr(c->rw.mr);
	c->rw.mr = NULL;
	c->rw.body = NULL;
	c->rw.active = 0;
	return rx_deliver(c, &c->rw.hdr, c->rw.hdr_bytes, body, c->rw.data);
}

static int handle_recv(struct rdma_conn *c, const struct ibv_wc *wc, uint32_t slot)
{
	uint32_t imm, kind, credits, id;
	const uint8_t *p = c->rpool.base + (size_t)slot * c->rpool.slot;

	if (!(wc->wc_flags & IBV_WC_WITH_IMM))
		return conn_fail(c, PS_EPROTO, "a message without immediate data");
	imm = ntohl(wc->imm_data);
	kind = imm >> 28;
	credits = (imm >> 16) & 0xfff;
	id = imm & 0xffff;
	if (ps_rdma_credit_grant(&c->cr, credits))
		return conn_fail(c, PS_EPROTO, "the peer returned %u credits, more than it was "
				 "given (%u of %u out)", credits, c->cr.total - c->cr.avail,
				 c->cr.total);
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
		return kind == K_WDONE ? rx_wdone(c, (uint16_t)id, wc->byte_len)
				       : conn_fail(c, PS_EPROTO, "an RDMA write whose immediate "
						   "data has kind %u", kind);
	switch (kind) {
	case K_FRAME:
		return rx_frame(c, p, wc->byte_len);
	case K_CREDIT:
		return 0;
	case K_WREQ:
		return rx_wreq(c, (uint16_t)id, p, wc->byte_len);
	case K_WGRANT:
		return rx_wgrant(c, (uint16_t)id, p, wc->byte_len);
	default:
		return conn_fail(c, PS_EPROTO, "a message of unknown kind %u (immediate data "
				 "0x%08x)", kind, imm);
	}
}

static void handle_wc(struct rdma_conn *c, const struct ibv_wc *wc)
{
	uint32_t what = (uint32_t)(wc->wr_id >> 32), idx = (uint32_t)wc->wr_id;

	if (what == WR_SEND || what == WR_WRITE)
		c->nposted--;
	if (wc->status != IBV_WC_SUCCESS) {
		if (c->lingering) {
			finish_close(c);
			return;
		}
		if (wc->status == IBV_WC_WR_FLUSH_ERR)
			rt_close(&c->base, PS_ECLOSED); /* the queue pair went down */
		else
			conn_fail(c, PS_ECLOSED, "%s failed: %s",
				  what == WR_RECV ? "a receive" : what == WR_WRITE ? "an RDMA write"
				  : "a send", ibv_wc_status_str(wc->status));
		return;
	}
	if (what == WR_RECV) {
		if (c->closing || idx >= NRECV || handle_recv(c, wc, idx) || c->closing)
			return;
		if (post_recv(c, idx)) {
			conn_fail(c, PS_ECLOSED, "ibv_post_recv failed");
			return;
		}
		ps_rdma_credit_reposted(&c->cr);
	} else if (what == WR_SEND && idx < NSEND) {
		struct out *o = c->sowner[idx];
		c->sowner[idx] = NULL;
		ps_rdma_pool_put(&c->spool, c->spool.base + (size_t)idx * c->spool.slot);
		if (o) {
			o->slot = -2; /* the slot is back in the pool */
			o->buf = NULL;
			if (o->cb)
				o->cb(&c->base, 0, o->arg);
			out_free(o);
		}
	} else if (what == WR_WRITE && c->w_head) {
		ps_debug("rdma %s: write %u: done", c->base.peer, c->w_head->id);
		struct out *o = c->w_head;
		c->w_head = o->next;
		if (!c->w_head)
			c->w_tail = NULL;
		if (o->cb)
			o->cb(&c->base, 0, o->arg);
		out_free(o);
	}
}

static void drain_cq(struct rdma_conn *c)
{
	struct ibv_wc wc[16];

	while (!c->closing || c->lingering) {
		int n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0) {
			conn_fail(c, PS_ECLOSED, "ibv_poll_cq failed");
			return;
		}
		if (n == 0)
			break;
		for (int i = 0; i < n && (!c->closing || c->lingering); i++)
			handle_wc(c, &wc[i]);
		if (c->lingering && c->nposted <= 0) {
			finish_close(c); /* every posted send completed */
			return;
		}
	}
	progress(c);
}

static void on_cq_event(uv_poll_t *h, int status, int events)
{
	struct rdma_conn *c = h->data;
	struct ibv_cq *cq;
	void *ctx;

	(void)events;
	if (c->closing && !c->lingering)
		return;
	if (status < 0) {
		if (c->lingering)
			finish_close(c);
		else
			conn_fail(c, PS_ECLOSED, "watching the completion channel: %s",
				  uv_strerror(status));
		return;
	}
	while (ibv_get_cq_event(c->ch, &cq, &ctx) == 0) {
		ibv_ack_cq_events(cq, 1);
		if (ibv_req_notify_cq(cq, 0)) {
			conn_fail(c, PS_ECLOSED, "ibv_req_notify_cq failed");
			return;
		}
	}
	if (c->established) /* else ESTABLISHED drains: no frame before on_accept */
		drain_cq(c);
}

/* The verbs side of a connection whose id has a device: PD, completion
 * channel (non-blocking, under uv_poll_t), CQ, RC queue pair, the two
 * registered pools, NRECV receives posted. */
static int verbs_setup(struct rdma_conn *c)
{
	struct ibv_context *ctx = c->id->verbs;
	struct ibv_qp_init_attr qa = { 0 };
	struct ibv_port_attr pa;
	int flags;

	if (!(c->pd = ibv_alloc_pd(ctx)) || !(c->ch = ibv_create_comp_channel(ctx)))
		return -errno ? -errno : -ENOMEM;
	flags = fcntl(c->ch->fd, F_GETFL);
	if (flags < 0 || fcntl(c->ch->fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	if (!(c->cq = ibv_create_cq(ctx, NRECV + NSEND + 2 * MAX_CHUNKS, c, c->ch, 0)))
		return -errno ? -errno : -ENOMEM;
	if (ibv_req_notify_cq(c->cq, 0))
		return PS_ECLOSED;
	qa.send_cq = qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = NSEND + 2 * MAX_CHUNKS;
	qa.cap.max_recv_wr = NRECV;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(c->id, c->pd, &qa))
		return -errno;
	c->qp_on = 1;
	c->max_msg = 1u << 30;
	if (ibv_query_port(ctx, c->id->port_num, &pa) == 0 && pa.max_msg_sz &&
	    pa.max_msg_sz < c->max_msg)
		c->max_msg = pa.max_msg_sz;
	if (ps_rdma_pool_init(&c->rpool, NRECV, SLOT_BYTES) ||
	    ps_rdma_pool_init(&c->spool, NSEND, SLOT_BYTES))
		return -ENOMEM;
	/* the fewest access flags: receives are written by the local device
	 * only, send buffers only read */
	c->rmr = ibv_reg_mr(c->pd, c->rpool.base, (size_t)NRECV * c->rpool.slot,
			    IBV_ACCESS_LOCAL_WRITE);
	c->smr = ibv_reg_mr(c->pd, c->spool.base, (size_t)NSEND * c->spool.slot, 0);
	if (!c->rmr || !c->smr)
		return -errno ? -errno : -ENOMEM;
	for (uint32_t i = 0; i < NRECV; i++)
		if (post_recv(c, i))
			return PS_ECLOSED;
	ps_rdma_credits_init(&c->cr, NRECV);
	if (uv_poll_init(c->base.t->loop, &c->cq_poll, c->ch->fd))
		return PS_ECLOSED;
	c->cq_poll.data = c;
	c->cq_poll_on = 1;
	uv_poll_start(&c->cq_poll, UV_READABLE, on_cq_event);
	return 0;
}

static struct rdma_conn_param conn_param(void)
{
	return (struct rdma_conn_param){ .retry_count = 7, .rnr_retry_count = 7 };
}

/* ---- the rdma_cm event channel ---- */

static void on_connect_request(struct rdma_transport *rt, struct rdma_cm_id *id)
{
	struct rdma_conn_param p = conn_param();
	struct rdma_conn *c;
	int rc;

	if (rt->destroying || !(c = conn_new(rt))) {
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return;
	}
	c->id = id;
	c->passive = 1;
	id->context = c;
	set_peer_name(c);
	rc = verbs_setup(c);
	if (!rc && rdma_accept(id, &p))
		rc = -errno;
	if (rc) {
		ps_warn("rdma: refusing connection from %s: %s", c->base.peer, ps_strerror(rc));
		rdma_reject(id, NULL, 0);
		rt_close(&c->base, rc); /* never announced: no on_close */
	}
}

static void on_established(struct rdma_conn *c)
{
	struct ps_transport_cbs *cbs = &c->base.t->cbs;

	c->established = 1;
	c->announced = 1;
	c->last_send_ms = uv_now(c->base.t->loop);
	if (c->passive) {
		if (cbs->on_accept)
			cbs->on_accept(c->base.t, &c->base);
	} else if (cbs->on_connect) {
		cbs->on_connect(&c->base, 0);
	}
	if (!c->closing)
		drain_cq(c); /* what arrived before this event */
}

/* A connection failed before it was established: an outgoing one reports
 * it (on_connect, then on_close), an accepted one goes quietly (its owner
 * never heard of it). */
static void connect_failed(struct rdma_conn *c, int rc, const char *what)
{
	if (c->closing)
		return;
	if (c->passive) {
		ps_info("rdma: connection from %s: %s: %s", c->base.peer, what, ps_strerror(rc));
		rt_close(&c->base, rc);
		return;
	}
	ps_debug("rdma: connecting to %s: %s: %s", c->base.peer, what, ps_strerror(rc));
	c->announced = 1; /* on_connect(status) then on_close, as on TCP */
	if (c->base.t->cbs.on_connect)
		c->base.t->cbs.on_connect(&c->base, rc);
	rt_close(&c->base, rc);
}

static void conn_event(struct rdma_conn *c, enum rdma_cm_event_type type, int status)
{
	struct rdma_conn_param p = conn_param();
	int rc;

	if (c->closing)
		return;
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(c->id, RESOLVE_MS))
			connect_failed(c, -errno, "rdma_resolve_route");
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		rc = verbs_setup(c);
		if (!rc && rdma_connect(c->id, &p))
			rc = -errno;
		if (rc)
			connect_failed(c, rc, "setting up the queue pair");
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		on_established(c);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		connect_failed(c, status < 0 ? status : -EHOSTUNREACH, rdma_event_str(type));
		break;
	case RDMA_CM_EVENT_REJECTED:
		connect_failed(c, -ECONNREFUSED, "rejected");
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (!c->established)
			connect_failed(c, PS_ECLOSED, rdma_event_str(type));
		else
			rt_close(&c->base, PS_ECLOSED);
		break;
	default:
		break;
	}
}

static void on_cm_event(uv_poll_t *h, int status, int events)
{
	struct rdma_transport *rt = h->data;
	struct rdma_cm_event *ev;

	(void)events;
	if (status < 0) {
		ps_error("rdma: watching the rdma_cm event channel: %s; closing every connection",
			 uv_strerror(status));
		uv_poll_stop(h);
		for (struct rdma_conn *c = rt->conns; c; c = c->next)
			rt_close(&c->base, PS_ECLOSED);
		return;
	}
	while (rdma_get_cm_event(rt->ec, &ev) == 0) {
		enum rdma_cm_event_type type = ev->event;
		struct rdma_cm_id *id = ev->id;
		int st = ev->status;

		rdma_ack_cm_event(ev); /* before anything may destroy the id */
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
			on_connect_request(rt, id);
		else if (id && id != rt->listener && id->context)
			conn_event(id->context, type, st);
	}
}

/* ---- keepalive ---- */

/* An idle established connection sends a credit message (never the
 * reserved credit): a peer that vanished without a word fails the send
 * once the queue pair's retries run out, and the connection closes. */
static void on_keepalive(uv_timer_t *t)
{
	struct rdma_transport *rt = t->data;
	uint64_t now = uv_now(rt->base.loop);

	for (struct rdma_conn *c = rt->conns; c; c = c->next)
		if (c->established && !c->closing && now - c->last_send_ms >= KEEPALIVE_MS &&
		    c->cr.avail >= 2)
			send_ctrl(c, K_CREDIT, 0, NULL, 0, 0);
}

/* ---- the transport ---- */

static void on_rt_handle_closed(uv_handle_t *h)
{
	struct rdma_transport *rt = h->data;

	if (--rt->nhandles == 0) {
		rdma_destroy_event_channel(rt->ec);
		free(rt);
	}
}

static void maybe_finish_destroy(struct rdma_transport *rt)
{
	if (rt->destroying != 1 || rt->nconns)
		return;
	rt->destroying = 2;
	if (rt->listener)
		rdma_destroy_id(rt->listener);
	rt->listener = NULL;
	rt->nhandles = 2;
	uv_close((uv_handle_t *)&rt->ec_poll, on_rt_handle_closed);
	uv_close((uv_handle_t *)&rt->keepalive, on_rt_handle_closed);
}

static int rt_create(uv_loop_t *loop, const struct ps_transport_cbs *cbs,
		       const struct ps_wire_limits *limits, void *data, struct ps_transport **out)
{
	struct rdma_transport *rt;
	char why[400];
	int rc, flags;

	*out = NULL;
	rc = ps_rdma_probe(NULL, why, sizeof(why));
	if (rc) {
		ps_error("transport rdma: %s", why);
		return rc;
	}
	rt = calloc(1, sizeof(*rt));
	if (!rt)
		return -ENOMEM;
	rt->ec = rdma_create_event_channel();
	if (!rt->ec) {
		rc = -errno;
		ps_error("transport rdma: rdma_create_event_channel: %s (is rdma_ucm loaded?)",
			 strerror(errno));
		free(rt);
		return rc ? rc : PS_ENOTSUP;
	}
	flags = fcntl(rt->ec->fd, F_GETFL);
	fcntl(rt->ec->fd, F_SETFL, flags | O_NONBLOCK);
	rt->base.ops = &ps_rdma_transport_ops;
	rt->base.loop = loop;
	rt->base.cbs = *cbs;
	rt->base.limits = *limits;
	rt->base.data = data;
	uv_poll_init(loop, &rt->ec_poll, rt->ec->fd);
	rt->ec_poll.data = rt;
	uv_poll_start(&rt->ec_poll, UV_READABLE, on_cm_event);
	uv_timer_init(loop, &rt->keepalive);
	rt->keepalive.data = rt;
	uv_timer_start(&rt->keepalive, on_keepalive, KEEPALIVE_MS, KEEPALIVE_MS);
	uv_unref((uv_handle_t *)&rt->keepalive);
	*out = &rt->base;
	return 0;
}

static int rt_listen(struct ps_transport *t, const char *host, int port)
{
	struct rdma_transport *rt = container_of(t, struct rdma_transport, base);
	struct sockaddr_storage ss;
	int rc = ps_transport_resolve(host, port, &ss);

	if (rc)
		return rc;
	if (rdma_create_id(rt->ec, &rt->listener, NULL, RDMA_PS_TCP))
		return -errno;
	if (rdma_bind_addr(rt->listener, (struct sockaddr *)&ss) ||
	    rdma_listen(rt->listener, 128)) {
		rc = -errno;
		rdma_destroy_id(rt->listener);
		rt->listener = NULL;
		return rc;
	}
	return 0;
}

static int rt_bound_port(struct ps_transport *t)
{
	struct rdma_transport *rt = container_of(t, struct rdma_transport, base);

	return rt->listener ? ntohs(rdma_get_src_port(rt->listener)) : PS_ESTATE;
}

static int rt_connect(struct ps_transport *t, const char *host, int port, void *data,
			   struct ps_conn **out)
{
	struct rdma_transport *rt = container_of(t, struct rdma_transport, base);
	struct sockaddr_storage ss;
	struct rdma_conn *c;
	int rc = ps_transport_resolve(host, port, &ss);

	if (rc)
		return rc;
	if (!(c = conn_new(rt)))
		return -ENOMEM;
	c->base.data = data;
	snprintf(c->base.peer, sizeof(c->base.peer), "%s:%d", host, port);
	if (rdma_create_id(rt->ec, &c->id, c, RDMA_PS_TCP) ||
	    rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&ss, RESOLVE_MS)) {
		rc = -errno;
		rt_close(&c->base, rc); /* not announced: the caller learns from rc */
		return rc ? rc : PS_ECLOSED;
	}
	c->announced = 1; /* the owner holds it: on_close always follows */
	*out = &c->base;
	return 0;
}

/* Seals a frame (header, metadata, payload pieces, tag when keyed) into
 * buf, numbering it on a keyed connection. */
static void seal_into(struct rdma_conn *c, struct ps_frame_hdr *h, uint8_t *buf,
		      const void *meta, uint32_t meta_len, const struct ps_iov *payload,
		      int npayload)
{
	uint8_t *p = buf + PS_WIRE_HDR_LEN;

	if (c->keyed) {
		h->flags |= PS_FRAME_F_MAC | (c->cipher >= 0 ? PS_FRAME_F_ENC : 0);
		h->seq = (uint32_t)c->send_seq;
	}
	ps_wire_encode_hdr(buf, h);
	if (meta_len)
		memcpy(p, meta, meta_len);
	p += meta_len;
	for (int i = 0; i < npayload; i++) {
		if (payload[i].len)
			memcpy(p, payload[i].base, payload[i].len);
		p += payload[i].len;
	}
	if (!c->keyed)
		return;
	size_t body = (size_t)(p - buf) - PS_WIRE_HDR_LEN;
	if (c->cipher >= 0) {
		ps_aead_begin(&c->saead, c->send_seq, buf, PS_WIRE_HDR_LEN);
		ps_aead_update(&c->saead, buf + PS_WIRE_HDR_LEN, buf + PS_WIRE_HDR_LEN, body);
		ps_aead_seal_end(&c->saead, p);
	} else {
		ps_mac_begin(&c->smac, c->keys.send, c->send_seq);
		ps_mac_update(&c->smac, buf, PS_WIRE_HDR_LEN + body);
		ps_mac_end(&c->smac, p);
	}
	c->send_seq++;
}

static int rt_send(struct ps_conn *pc, uint8_t type, const void *meta, uint32_t meta_len,
		     const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		     void *arg)
{
	struct rdma_conn *c = container_of(pc, struct rdma_conn, base);
	struct ps_frame_hdr h = { .type = type, .meta_len = meta_len,
				  .flags = (uint16_t)(flags >> 16) };
	struct out *o;
	size_t len;

	if (c->closing || !c->established)
		return PS_ECLOSED;
	if ((flags & PS_SEND_VOLATILE) && cb)
		return -EINVAL;
	for (int i = 0; i < npayload; i++)
		h.payload_len += payload[i].len;
	len = PS_WIRE_HDR_LEN + meta_len + h.payload_len + (c->keyed ? PS_MAC_TAG_LEN : 0);
	/* placement by rdma_proto.c's rule; a big frame's body is at most
	 * MAX_CHUNKS writes and a grant's 32-bit length */
	uint64_t most = c->max_msg * MAX_CHUNKS < UINT32_MAX ? c->max_msg * MAX_CHUNKS : UINT32_MAX;
	enum ps_rdma_place place = ps_rdma_place_frame(len - PS_WIRE_HDR_LEN, SLOT_BYTES -
						       PS_WIRE_HDR_LEN, most);
	if (place == PS_RDMA_TOO_BIG)
		return PS_ETOOBIG;
	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	o->cb = (flags & PS_SEND_VOLATILE) ? NULL : cb;
	o->arg = arg;
	o->len = len;
	o->big = place == PS_RDMA_WRITE;
	o->slot = -1;
	if (o->big) {
		o->test_delta = c->test_write_delta;
		c->test_write_delta = 0;
	}
	/* straight into a send buffer when nothing waits before it */
	if (!o->big && !c->q_head && c->spool.nfree) {
		o->buf = ps_rdma_pool_get(&c->spool);
		o->slot = (int)ps_rdma_pool_index(&c->spool, o->buf);
	} else if (!(o->buf = malloc(len + (o->test_delta > 0 ? (size_t)o->test_delta : 0)))) {
		free(o);
		return -ENOMEM;
	}
	seal_into(c, &h, o->buf, meta, meta_len, payload, npayload);
	if (c->q_tail)
		c->q_tail->next = o;
	else
		c->q_head = o;
	c->q_tail = o;
	c->queued += len;
	c->base.bytes_out += len;
	progress(c);
	return 0;
}

static void rt_set_keys(struct ps_conn *pc, const struct ps_frame_keys *keys)
{
	struct rdma_conn *c = container_of(pc, struct rdma_conn, base);
	int rc = 0;

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
	if (rc) {
		ps_error("closing connection %s: cannot set up %s: %s", c->base.peer,
			 ps_cipher_name(c->cipher), ps_strerror(rc));
		rt_close(pc, rc);
	}
}

static void rt_set_limits(struct ps_conn *pc, const struct ps_wire_limits *lim)
{
	container_of(pc, struct rdma_conn, base)->limits = *lim;
}

static size_t rt_queued_bytes(struct ps_conn *pc)
{
	return container_of(pc, struct rdma_conn, base)->queued;
}

static void rt_queue_stats(struct ps_transport *t, struct ps_queue_stats *out)
{
	struct rdma_transport *rt = container_of(t, struct rdma_transport, base);

	*out = (struct ps_queue_stats){ rt->queued, rt->peak, rt->peak_total, rt->npaused };
}

static void rt_destroy(struct ps_transport *t)
{
	struct rdma_transport *rt = container_of(t, struct rdma_transport, base);

	if (rt->destroying)
		return;
	rt->destroying = 1;
	for (struct rdma_conn *c = rt->conns; c; c = c->next)
		rt_close(&c->base, 0);
	maybe_finish_destroy(rt);
}

/* ---- for tests ---- */

int ps_rdma_test_post(struct ps_conn *pc, unsigned kind, unsigned credits, unsigned id,
		      const void *body, uint32_t len)
{
	struct rdma_conn *c = container_of(pc, struct rdma_conn, base);
	struct ibv_sge sge;
	struct ibv_send_wr wr = { .num_sge = len ? 1 : 0, .sg_list = &sge,
				  .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	uint8_t *buf;

	if (!c->established || c->closing || len > SLOT_BYTES || !c->spool.nfree)
		return PS_ESTATE;
	buf = ps_rdma_pool_get(&c->spool);
	if (len)
		memcpy(buf, body, len);
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = len, .lkey = c->smr->lkey };
	wr.wr_id = ((uint64_t)WR_SEND << 32) | (uint64_t)ps_rdma_pool_index(&c->spool, buf);
	wr.imm_data = htonl(((kind & 0xf) << 28) | ((credits & 0xfff) << 16) | (id & 0xffff));
	if (ibv_post_send(c->id->qp, &wr, &bad))
		return PS_ECLOSED;
	c->nposted++;
	return 0;
}

void ps_rdma_test_write_delta(struct ps_conn *pc, int32_t delta)
{
	container_of(pc, struct rdma_conn, base)->test_write_delta = delta;
}

const struct ps_transport_ops ps_rdma_transport_ops = {
	.name = "rdma",
	.create = rt_create,
	.listen = rt_listen,
	.bound_port = rt_bound_port,
	.connect = rt_connect,
	.send = rt_send,
	.set_keys = rt_set_keys,
	.set_limits = rt_set_limits,
	.queued_bytes = rt_queued_bytes,
	.queue_stats = rt_queue_stats,
	.close = rt_close,
	.destroy = rt_destroy,
};
