/* wire.c - encode and check the fixed frame header. */
#include <stdio.h>
#include <string.h>
#include "ps_err.h"
#include "wire.h"

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

void ps_wire_encode_hdr(uint8_t out[PS_WIRE_HDR_LEN], const struct ps_frame_hdr *h)
{
	put_le32(out, PS_WIRE_MAGIC);
	out[4] = h->version ? h->version : PS_PROTOCOL_VERSION;
	out[5] = h->type;
	out[6] = (uint8_t)h->flags;
	out[7] = (uint8_t)(h->flags >> 8);
	put_le32(out + 8, h->meta_len);
	put_le32(out + 12, (h->flags & PS_FRAME_F_MAC) ? h->seq : 0);
	put_le64(out + 16, h->payload_len);
}

const char *ps_wire_type_name(unsigned type)
{
	static const char *const names[PS_MSG_MAX_] = {
		[PS_MSG_HELLO] = "hello", [PS_MSG_HELLO_REPLY] = "hello-reply",
		[PS_MSG_PUSH] = "push", [PS_MSG_PUSH_ACK] = "push-ack",
		[PS_MSG_PULL] = "pull", [PS_MSG_PULL_REPLY] = "pull-reply",
		[PS_MSG_ERROR] = "error", [PS_MSG_STATS_REQUEST] = "stats-request",
		[PS_MSG_STATS] = "stats", [PS_MSG_HEARTBEAT] = "heartbeat",
		[PS_MSG_AUTH_CHALLENGE] = "auth-challenge", [PS_MSG_AUTH] = "auth",
		[PS_MSG_PULL_ROWS] = "pull-rows", [PS_MSG_PULL_ROWS_REPLY] = "pull-rows-reply",
		[PS_MSG_PUSH_ROWS] = "push-rows",
		[PS_MSG_REPL_BATCH] = "repl-batch", [PS_MSG_REPL_ACK] = "repl-ack",
		[PS_MSG_REPL_SNAPSHOT] = "repl-snapshot", [PS_MSG_DECLARE] = "declare",
		[PS_MSG_DECLARE_TABLES] = "declare-tables",
	};
	return type < PS_MSG_MAX_ && names[type] ? names[type] : "unknown";
}

int ps_wire_decode_hdr(const uint8_t in[PS_WIRE_HDR_LEN], const struct ps_wire_limits *lim,
		       struct ps_frame_hdr *h, char *why, size_t whylen)
{
	uint32_t magic = get_le32(in);

	if (magic != PS_WIRE_MAGIC) {
		snprintf(why, whylen, "bad frame magic 0x%08x (expected 0x%08x)", magic,
			 PS_WIRE_MAGIC);
		return PS_EPROTO;
	}
	h->version = in[4];
	h->type = in[5];
	h->flags = (uint16_t)(in[6] | in[7] << 8);
	h->meta_len = get_le32(in + 8);
	h->payload_len = get_le64(in + 16);
	if (h->version != PS_PROTOCOL_VERSION) {
		snprintf(why, whylen, "protocol version %u, this side speaks %u", h->version,
			 PS_PROTOCOL_VERSION);
		return PS_EVERSION;
	}
	if (h->type == 0 || h->type >= PS_MSG_MAX_) {
		snprintf(why, whylen, "unknown message type %u", h->type);
		return PS_EPROTO;
	}
	if (h->flags & ~PS_FRAME_F_KNOWN) {
		snprintf(why, whylen, "unknown frame flags 0x%04x", h->flags);
		return PS_EPROTO;
	}
	if ((h->flags & PS_FRAME_F_ENC) && !(h->flags & PS_FRAME_F_MAC)) {
		snprintf(why, whylen, "frame flag ENC without flag MAC");
		return PS_EPROTO;
	}
	h->seq = get_le32(in + 12);
	if (!(h->flags & PS_FRAME_F_MAC) && h->seq != 0) {
		snprintf(why, whylen, "reserved header field is 0x%08x, must be 0 without flag MAC",
			 h->seq);
		return PS_EPROTO;
	}
	if (h->meta_len > lim->max_meta) {
		snprintf(why, whylen, "%s metadata of %u bytes exceeds the limit of %u",
			 ps_wire_type_name(h->type), h->meta_len, lim->max_meta);
		return PS_ETOOBIG;
	}
	/* Compared without adding: meta_len + payload_len can wrap past 2^64. */
	if (h->payload_len > lim->max_frame || h->meta_len > lim->max_frame - h->payload_len) {
		snprintf(why, whylen, "%s frame of %u + %llu bytes (metadata + payload) exceeds "
			 "the limit of %llu", ps_wire_type_name(h->type), h->meta_len,
			 (unsigned long long)h->payload_len, (unsigned long long)lim->max_frame);
		return PS_ETOOBIG;
	}
	return 0;
}
