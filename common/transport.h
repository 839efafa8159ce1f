/* transport.h - how frames move between processes (docs/architecture.md, Interfaces).
 *
 * A transport is a const struct ps_transport_ops found by name ("tcp",
 * "rdma") plus the objects it creates. Everything runs on one libuv loop
 * thread: every function here must be called on that thread, and every
 * callback fires on it, never from inside the call that caused it.
 *
 * Receiving: the transport reads the fixed header, checks it against the
 * connection's limits (ps_wire_decode_hdr) before allocating anything, then
 * receives metadata and payload into one buffer that it hands to on_frame.
 * The callee owns the frame and returns it with ps_frame_release(), possibly
 * much later (a sync shard keeps gradient frames until the barrier).
 *
 * Sending: header and metadata are copied (they are small); the payload is
 * given as pieces (iovecs) that are written without copying. With
 * PS_SEND_STABLE the caller keeps the pieces unchanged until cb fires. With
 * PS_SEND_VOLATILE the pieces may change once send returns: what the socket
 * does not take at once is copied, and no callback is taken.
 *
 * Two exceptions to the one-thread rule: send_now and recv_now may be
 * called from any thread (a client's calling thread), see below.
 *
 * Implementations embed struct ps_transport / struct ps_conn first and find
 * themselves with container_of. The shape leaves room for RDMA: frames are
 * released through the frame's own function (a registered buffer goes back
 * to its pool), and a transport may watch any fd with uv_poll_t.
 */
#ifndef PS_TRANSPORT_H
#define PS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include "wire.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#endif

struct ps_transport;
struct ps_conn;
struct ps_frame_keys;

struct ps_frame {
	struct ps_frame_hdr hdr;
	uint8_t *meta;       /* hdr.meta_len bytes */
	uint8_t *payload;    /* hdr.payload_len bytes, right after meta */
	/* 1 when the transport checked, as the bytes arrived, that every
	 * 4-byte word from the start of the payload is a finite float32 (so
	 * raw slices at 4-aligned offsets need no second pass); 0 = not known
	 * or not so. */
	int payload_finite;
	/* Returns the buffer to whoever allocated it; use ps_frame_release(). */
	void (*release)(struct ps_frame *f);
};

static inline void ps_frame_release(struct ps_frame *f)
{
	if (f)
		f->release(f);
}

struct ps_iov {
	const void *base;
	size_t len;
};

enum ps_send_flags {
	PS_SEND_STABLE = 0,    /* payload unchanged until cb fires */
	PS_SEND_VOLATILE = 1,  /* payload read (written or copied) before send returns; cb must be NULL */
};
/* Frame header flags (PS_FRAME_F_*) ride in the high half of the send flags. */
#define PS_SEND_FRAME_FLAGS(f) ((unsigned)(f) << 16)

/* Limits of one send_now call (all its frames together): more goes
 * through the loop thread. */
#define PS_SEND_NOW_MAX (64 * 1024)
#define PS_SEND_NOW_IOV 16
#define PS_SEND_NOW_FRAMES 4

/* One frame for send_now. flags: PS_SEND_FRAME_FLAGS(PS_FRAME_F_*). */
struct ps_out_frame {
	uint8_t type;
	unsigned flags;
	const void *meta;
	uint32_t meta_len;
	const struct ps_iov *payload;
	int npayload;
};

/* Fires once per accepted send: status 0 when the bytes are handed to the
 * kernel, negative when the connection closed first. */
typedef void (*ps_send_cb)(struct ps_conn *c, int status, void *arg);

/* recv_now hands each whole frame it read to this, on the calling thread;
 * the callee owns f. */
typedef void (*ps_take_cb)(struct ps_conn *c, struct ps_frame *f, void *arg);

/* Bytes queued to send (limits.max_queue / max_queue_total bound them). */
struct ps_queue_stats {
	uint64_t bytes;       /* on every connection together, now */
	uint64_t peak_conn;   /* the most one connection had */
	uint64_t peak_total;  /* the most every connection together had */
	int paused;           /* connections not read now (backpressure) */
};

struct ps_transport_cbs {
	/* A listening transport accepted c. Set c->data here. */
	void (*on_accept)(struct ps_transport *t, struct ps_conn *c);
	/* An outgoing connection finished (status 0) or failed (then on_close follows). */
	void (*on_connect)(struct ps_conn *c, int status);
	/* A complete, header-checked frame; the callee owns f. */
	void (*on_frame)(struct ps_conn *c, struct ps_frame *f);
	/* Last callback for c: status 0 for a local close, negative for the
	 * reason (PS_ECLOSED peer closed, PS_EPROTO/PS_ETOOBIG bad frame, ...).
	 * c is freed when this returns. */
	void (*on_close)(struct ps_conn *c, int status);
};

struct ps_transport {
	const struct ps_transport_ops *ops;
	uv_loop_t *loop;
	struct ps_transport_cbs cbs;
	struct ps_wire_limits limits; /* applied to new connections */
	void *data;                   /* owner's */
};

struct ps_conn {
	struct ps_transport *t;
	void *data;                   /* owner's */
	char peer[80];                /* "host:port" for logs */
	uint64_t bytes_in, bytes_out; /* frame bytes, including headers */
};

struct ps_transport_ops {
	const char *name;
	/* Creates a transport on loop. limits apply to every connection until
	 * ps_conn_set_limits changes them. Returns 0 or -errno/PS_E*. */
	int (*create)(uv_loop_t *loop, const struct ps_transport_cbs *cbs,
		      const struct ps_wire_limits *limits, void *data, struct ps_transport **out);
	/* Listens on host:port (host must be an address or resolvable name:
	 * PS_ERESOLVE when it does not resolve); accepted connections arrive
	 * through on_accept. Non-blocking. */
	int (*listen)(struct ps_transport *t, const char *host, int port);
	/* Port actually bound (useful with port 0), or negative. */
	int (*bound_port)(struct ps_transport *t);
	/* Optional (NULL when the transport has none): the address the
	 * listener is bound to, "a.b.c.d:port" or "[v6]:port", into buf (a
	 * name given to listen shows here as what it resolved to). 0 or
	 * negative. */
	int (*bound_addr)(struct ps_transport *t, char *buf, size_t len);
	/* Starts connecting to host:port (an address, or a name: PS_ERESOLVE
	 * when it does not resolve); on_connect reports the result. *out is
	 * valid until on_close. */
	int (*connect)(struct ps_transport *t, const char *host, int port, void *data,
		       struct ps_conn **out);
	/* Queues one frame. meta (meta_len bytes) is copied. Returns 0 (cb will
	 * fire, unless flags is VOLATILE) or negative (cb never fires). */
	int (*send)(struct ps_conn *c, uint8_t type, const void *meta, uint32_t meta_len,
		    const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		    void *arg);
	/* Optional (NULL when the transport has none); the only op callable
	 * from any thread. Writes the nf frames f[0..nf) (at most
	 * PS_SEND_NOW_FRAMES, PS_SEND_NOW_MAX bytes and PS_SEND_NOW_IOV
	 * payload pieces in all) right away, in one system call, if c has
	 * nothing queued, so they leave without a hop to the loop thread and
	 * reach the peer together (a push and the pull behind it are read and
	 * answered in one go). Payloads are read before it returns (VOLATILE
	 * semantics, no callback). Returns 0 when every byte went to the
	 * kernel; -EAGAIN when nothing was written (closing, too big, writes
	 * queued, socket full) and the caller must use send on the loop
	 * thread; PS_ECLOSED when the connection broke mid-frame (the loop
	 * thread will see it close). The caller must make sure c stays alive
	 * during the call and that no send for c runs on the loop thread in
	 * between (frame order). */
	int (*send_now)(struct ps_conn *c, const struct ps_out_frame *f, int nf);
	/* Optional, callable from any thread: reads what c's socket holds
	 * now, without blocking, and hands each whole frame to take on the
	 * calling thread instead of on_frame on the loop thread. A thread
	 * waiting for a reply polls with it and gets the reply without the
	 * loop thread's wake-up and hand-over on the latency path. Returns
	 * how many frames it took (0: none complete yet), or -EAGAIN when the
	 * loop thread is reading c or c is closing. A bad frame, the peer
	 * closing or an error is not reported here: the loop thread closes c
	 * with the reason (on_close). The caller must make sure c stays alive
	 * during the call (the client holds the lock its on_close takes). */
	int (*recv_now)(struct ps_conn *c, ps_take_cb take, void *arg);
	/* Authenticates c's frames from now on (frame_mac.h): every frame
	 * sent after this call carries a sequence number and a MAC under
	 * keys->send, and every frame whose header arrives after it must carry
	 * them under keys->recv (else c closes with PS_EAUTH). Sequence numbers
	 * start at 0 in both directions. Loop thread; called once, between
	 * frames (from on_frame of the last unauthenticated one). */
	void (*set_keys)(struct ps_conn *c, const struct ps_frame_keys *keys);
	/* Changes the limits frames received on c are checked against. */
	void (*set_limits)(struct ps_conn *c, const struct ps_wire_limits *lim);
	/* Bytes queued on c and not yet taken by the kernel. */
	size_t (*queued_bytes)(struct ps_conn *c);
	/* Optional (NULL: not counted): the backpressure counters. Loop thread. */
	void (*queue_stats)(struct ps_transport *t, struct ps_queue_stats *out);
	/* Closes c; pending sends fail; on_close(c, status) fires later. Idempotent. */
	void (*close)(struct ps_conn *c, int status);
	/* Closes the listener and every connection (each gets on_close), then
	 * frees t once the loop has run the close callbacks. */
	void (*destroy)(struct ps_transport *t);
};

/* The registry: NULL for an unknown or unavailable name. */
const struct ps_transport_ops *ps_transport_find(const char *name);

struct ps_config;
/* The transport cfg names, or NULL when this machine cannot run it, with
 * one line naming what is missing in why and the code in *rc (rdma without
 * a usable device: ps_rdma_probe). */
const struct ps_transport_ops *ps_transport_for(const struct ps_config *cfg, char *why,
						size_t whylen, int *rc);

/* Shared by the transports' receive paths. */

/* Whether header h carries what its connection's state demands: no MAC
 * before keys are set; once keyed (cipher -1: MACs, else encrypted) a MAC,
 * the matching F_ENC flag and sequence number recv_seq. 0, or PS_EPROTO /
 * PS_EAUTH with the reason in why. */
int ps_frame_check_auth(const struct ps_frame_hdr *h, int keyed, int cipher, uint64_t recv_seq,
			char *why, size_t whylen);

/* One buffer for a received frame: a struct ps_frame, padding, meta_len
 * bytes of metadata, the payload on a 64-byte boundary (so tensors in it
 * read as aligned floats) and room for a tag. Sets *data to where the
 * metadata goes; free() releases it. NULL when out of memory. */
uint8_t *ps_frame_body_alloc(uint32_t meta_len, uint64_t payload_len, uint8_t **data);

struct sockaddr_storage;
/* host (an IPv4 or IPv6 address, or a name resolved synchronously: start-up
 * only) and port into ss. 0, or PS_ERESOLVE when the name does not resolve. */
int ps_transport_resolve(const char *host, int port, struct sockaddr_storage *ss);

extern const struct ps_transport_ops ps_tcp_transport_ops;
extern const struct ps_transport_ops ps_rdma_transport_ops;

#endif
