/* msg.c - pack, send and unpack frame metadata. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "msg.h"
#include "ps_log.h"
#include "ps_err.h"

const ProtobufCMessageDescriptor *ps_msg_descriptor(unsigned type)
{
	switch (type) {
	case PS_MSG_HELLO: return &ps__hello__descriptor;
	case PS_MSG_HELLO_REPLY: return &ps__hello_reply__descriptor;
	case PS_MSG_PUSH: return &ps__push__descriptor;
	case PS_MSG_PUSH_ACK: return &ps__push_ack__descriptor;
	case PS_MSG_PULL: return &ps__pull__descriptor;
	case PS_MSG_PULL_REPLY: return &ps__pull_reply__descriptor;
	case PS_MSG_ERROR: return &ps__error__descriptor;
	case PS_MSG_STATS_REQUEST: return &ps__stats_request__descriptor;
	case PS_MSG_STATS: return &ps__stats__descriptor;
	case PS_MSG_HEARTBEAT: return &ps__heartbeat__descriptor;
	case PS_MSG_AUTH_CHALLENGE: return &ps__auth_challenge__descriptor;
	case PS_MSG_AUTH: return &ps__auth__descriptor;
	case PS_MSG_PULL_ROWS: return &ps__pull_rows__descriptor;
	case PS_MSG_PULL_ROWS_REPLY: return &ps__pull_rows_reply__descriptor;
	case PS_MSG_PUSH_ROWS: return &ps__push_rows__descriptor;
	case PS_MSG_REPL_BATCH: return &ps__repl_batch__descriptor;
	case PS_MSG_REPL_ACK: return &ps__repl_ack__descriptor;
	case PS_MSG_REPL_SNAPSHOT: return &ps__repl_snapshot__descriptor;
	case PS_MSG_DECLARE: return &ps__declare__descriptor;
	case PS_MSG_DECLARE_TABLES: return &ps__declare_tables__descriptor;
	default: return NULL;
	}
}

int ps_msg_send(struct ps_conn *c, unsigned type, const ProtobufCMessage *m,
		const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		void *arg)
{
	uint8_t small[512], *buf = small;
	size_t len = protobuf_c_message_get_packed_size(m);
	int rc;

	if (len > UINT32_MAX)
		return PS_ETOOBIG;
	if (len > sizeof(small)) {
		buf = malloc(len);
		if (!buf) {
			rc = -ENOMEM;
			goto lost;
		}
	}
	protobuf_c_message_pack(m, buf);
	rc = c->t->ops->send(c, (uint8_t)type, buf, (uint32_t)len, payload, npayload, flags, cb,
			     arg);
	if (buf != small)
		free(buf);
	if (rc != -ENOMEM)
		return rc;
lost:
	/* a frame that could not be queued (out of memory) would leave its
	 * peer waiting for it until a timeout: the connection is closed, so
	 * the peer sees the loss at once (a client sends again once
	 * reconnected) */
	ps_error("closing connection %s: out of memory sending a frame of type %u", c->peer, type);
	c->t->ops->close(c, rc);
	return rc;
}

int ps_msg_send_error(struct ps_conn *c, uint64_t req_id, int code, const char *fmt, ...)
{
	Ps__Error e = PS__ERROR__INIT;
	char text[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	e.req_id = req_id;
	e.code = code;
	e.message = text;
	return ps_msg_send(c, PS_MSG_ERROR, &e.base, NULL, 0, PS_SEND_VOLATILE, NULL, NULL);
}

/* Memory one frame's metadata may take once unpacked: a small multiple of
 * its size. protobuf-c allocates a struct and a pointer per repeated
 * sub-message, 72 bytes for a slice reference: an empty entry, 2 bytes on
 * the wire, would cost 36 times its size; the smallest valid one (a
 * length alone, 5 bytes) 15 times; real ones (slice, offset, length)
 * under 8 times. */
#define META_BUDGET(len) (32 * (size_t)(len) + 4096)

struct budget {
	size_t left;
	int exceeded;
};

static void *budget_alloc(void *data, size_t size)
{
	struct budget *b = data;

	if (size > b->left) {
		b->exceeded = 1;
		return NULL;
	}
	b->left -= size;
	return malloc(size);
}

static void budget_free(void *data, void *p)
{
	(void)data;
	free(p); /* what budget_alloc returned is plain malloc memory */
}

ProtobufCMessage *ps_msg_unpack(const struct ps_frame *f, char *why, size_t whylen)
{
	const ProtobufCMessageDescriptor *d = ps_msg_descriptor(f->hdr.type);
	struct budget b = { .left = META_BUDGET(f->hdr.meta_len) };
	ProtobufCAllocator a = { budget_alloc, budget_free, &b };
	ProtobufCMessage *m;

	if (!d) {
		snprintf(why, whylen, "frame type %u has no metadata schema", f->hdr.type);
		return NULL;
	}
	m = protobuf_c_message_unpack(d, &a, f->hdr.meta_len, f->meta);
	if (!m && b.exceeded)
		snprintf(why, whylen, "%s metadata (%u bytes) would take more than %zu bytes "
			 "unpacked (empty repeated entries?)", ps_wire_type_name(f->hdr.type),
			 f->hdr.meta_len, META_BUDGET(f->hdr.meta_len));
	else if (!m)
		snprintf(why, whylen, "%s metadata (%u bytes) does not decode",
			 ps_wire_type_name(f->hdr.type), f->hdr.meta_len);
	return m;
}
