/* check_wire.c - the fixed frame header (common/wire.c) and the protobuf-c
 * metadata layer (common/msg.c): byte layout and round trips, every reason
 * ps_wire_decode_hdr refuses a header (magic, version, type, flags, reserved
 * field, metadata and frame limits, length sums that overflow), limits that
 * are met exactly, metadata that does not decode (an error, never a crash),
 * and what ps_msg_send hands to a transport. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include "msg.h"
#include "ps_err.h"
#include "wire.h"
#include "test_util.h"

static const struct ps_wire_limits big = { .max_frame = UINT64_MAX, .max_meta = UINT32_MAX };

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

/* A valid header of type push, built by the encoder. */
static void good_hdr(uint8_t b[PS_WIRE_HDR_LEN], uint32_t meta_len, uint64_t payload_len)
{
	struct ps_frame_hdr h = { .type = PS_MSG_PUSH, .meta_len = meta_len,
				  .payload_len = payload_len };
	ps_wire_encode_hdr(b, &h);
}

/* Decodes b; fills why with a canary first so a missing reason shows. */
static int decode(const uint8_t *b, const struct ps_wire_limits *lim, struct ps_frame_hdr *h,
		  char *why, size_t n)
{
	memset(why, 'X', n);
	why[n - 1] = '\0';
	return ps_wire_decode_hdr(b, lim, h, why, n);
}

/* ---- layout and round trips ---- */

START_TEST(test_encode_layout)
{
	struct ps_frame_hdr h = { .version = 0, .type = PS_MSG_PULL_REPLY, .flags = 0xa1b2,
				  .meta_len = 0x04030201u, .payload_len = 0x0f0e0d0c0b0a0908ull };
	uint8_t b[PS_WIRE_HDR_LEN];
	const uint8_t want[PS_WIRE_HDR_LEN] = {
		'P', 'S', 'F', '1', PS_PROTOCOL_VERSION, PS_MSG_PULL_REPLY, 0xb2, 0xa1,
		0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0,
		0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
	};

	memset(b, 0xee, sizeof(b));
	ps_wire_encode_hdr(b, &h);
	/* Version 0 means "this side's version"; the reserved word is zeroed. */
	for (int i = 0; i < PS_WIRE_HDR_LEN; i++)
		ck_assert_msg(b[i] == want[i], "byte %d is 0x%02x, want 0x%02x", i, b[i], want[i]);
	/* An explicit version is written as given (a test peer can lie). */
	h.version = 7;
	ps_wire_encode_hdr(b, &h);
	ck_assert_uint_eq(b[4], 7);
}
END_TEST

START_TEST(test_roundtrip_every_type)
{
	const uint32_t metas[] = { 0, 1, 511, 4096, 0x7fffffffu, UINT32_MAX };
	const uint64_t pays[] = { 0, 1, 4095, 1ull << 32, (1ull << 40) + 3, UINT64_MAX - UINT32_MAX };
	const uint16_t flags[] = { 0, PS_FRAME_F_LZ4 };
	char why[128];
	int n = 0;

	for (unsigned t = 1; t < PS_MSG_MAX_; t++)
		for (size_t m = 0; m < sizeof(metas) / sizeof(metas[0]); m++)
			for (size_t p = 0; p < sizeof(pays) / sizeof(pays[0]); p++)
				for (size_t f = 0; f < 2; f++) {
					struct ps_frame_hdr in = { .type = (uint8_t)t, .flags = flags[f],
								   .meta_len = metas[m],
								   .payload_len = pays[p] },
							    out;
					uint8_t b[PS_WIRE_HDR_LEN];
					ps_wire_encode_hdr(b, &in);
					memset(&out, 0x55, sizeof(out));
					int rc = ps_wire_decode_hdr(b, &big, &out, why, sizeof(why));
					ck_assert_msg(rc == 0, "type %u meta %u payload %llu: %d %s", t,
						      metas[m], (unsigned long long)pays[p], rc, why);
					ck_assert_uint_eq(out.version, PS_PROTOCOL_VERSION);
					ck_assert_uint_eq(out.type, t);
					ck_assert_uint_eq(out.flags, flags[f]);
					ck_assert_uint_eq(out.meta_len, metas[m]);
					ck_assert_uint_eq(out.payload_len, pays[p]);
					n++;
				}
	ck_assert_int_eq(n, (PS_MSG_MAX_ - 1) * 6 * 6 * 2);
}
END_TEST

/* Flag MAC: the header carries the sequence number (low 32 bits) where it
 * is otherwise 0, and only then. */
START_TEST(test_mac_flag_and_seq)
{
	struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 1 << 16 };
	struct ps_frame_hdr h = { .type = PS_MSG_PUSH, .flags = PS_FRAME_F_MAC, .seq = 0xdeadbeef,
				  .meta_len = 10, .payload_len = 100 }, out;
	uint8_t b[PS_WIRE_HDR_LEN];
	char why[200];

	ps_wire_encode_hdr(b, &h);
	ck_assert_int_eq(ps_wire_decode_hdr(b, &lim, &out, why, sizeof(why)), 0);
	ck_assert_uint_eq(out.seq, 0xdeadbeef);
	ck_assert_uint_eq(out.flags, PS_FRAME_F_MAC);
	h.flags = 0; /* no MAC: the number is not written */
	ps_wire_encode_hdr(b, &h);
	ck_assert_int_eq(ps_wire_decode_hdr(b, &lim, &out, why, sizeof(why)), 0);
	ck_assert_uint_eq(out.seq, 0);
	b[13] = 1; /* a number without the flag */
	ck_assert_int_eq(ps_wire_decode_hdr(b, &lim, &out, why, sizeof(why)), PS_EPROTO);
	ck_assert_msg(strstr(why, "without flag MAC"), "%s", why);
}
END_TEST

START_TEST(test_type_names)
{
	const char *names[] = { NULL, "hello", "hello-reply", "push", "push-ack", "pull",
				"pull-reply", "error", "stats-request", "stats", "heartbeat",
				"auth-challenge", "auth", "pull-rows", "pull-rows-reply",
				"push-rows", "repl-batch", "repl-ack", "repl-snapshot", "declare",
				"declare-tables" };
	_Static_assert(sizeof(names) / sizeof(names[0]) == PS_MSG_MAX_, "a name per type");

	for (unsigned t = 1; t < PS_MSG_MAX_; t++) {
		ck_assert_str_eq(ps_wire_type_name(t), names[t]);
		ck_assert_ptr_nonnull(ps_msg_descriptor(t));
	}
	ck_assert_str_eq(ps_wire_type_name(0), "unknown");
	ck_assert_str_eq(ps_wire_type_name(PS_MSG_MAX_), "unknown");
	ck_assert_str_eq(ps_wire_type_name(255), "unknown");
	ck_assert_str_eq(ps_wire_type_name(~0u), "unknown");
	ck_assert_ptr_null(ps_msg_descriptor(0));
	ck_assert_ptr_null(ps_msg_descriptor(PS_MSG_MAX_));
	ck_assert_ptr_null(ps_msg_descriptor(~0u));
	/* Each type's schema is the message the protocol names for it. */
	ck_assert_ptr_eq(ps_msg_descriptor(PS_MSG_HELLO), &ps__hello__descriptor);
	ck_assert_ptr_eq(ps_msg_descriptor(PS_MSG_PUSH), &ps__push__descriptor);
	ck_assert_ptr_eq(ps_msg_descriptor(PS_MSG_STATS), &ps__stats__descriptor);
	ck_assert_ptr_eq(ps_msg_descriptor(PS_MSG_ERROR), &ps__error__descriptor);
}
END_TEST

/* ---- rejections ---- */

START_TEST(test_reject_bad_magic)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	/* Every single-bit error in the magic is caught. */
	for (int bit = 0; bit < 32; bit++) {
		good_hdr(b, 10, 10);
		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EPROTO);
		ck_assert_msg(strstr(why, "magic"), "reason '%s'", why);
	}
	/* Byte-swapped magic (a big-endian peer) and an HTTP request. */
	good_hdr(b, 10, 10);
	b[0] = '1'; b[1] = 'F'; b[2] = 'S'; b[3] = 'P';
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EPROTO);
	memcpy(b, "GET / HTTP/1.1\r\nHost: x\r\n", PS_WIRE_HDR_LEN);
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EPROTO);
	ck_assert_ptr_nonnull(strstr(why, "0x20544547")); /* names the value seen */
	memset(b, 0, sizeof(b));
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EPROTO);
}
END_TEST

START_TEST(test_reject_bad_version)
{
	const uint8_t bad[] = { 0, 2, 3, 0x7f, 0x80, 0xff };
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200], want[32];

	for (size_t i = 0; i < sizeof(bad); i++) {
		good_hdr(b, 1, 1);
		b[4] = bad[i];
		ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EVERSION);
		/* The reason names both versions. */
		snprintf(want, sizeof(want), "version %u", bad[i]);
		ck_assert_msg(strstr(why, want), "'%s' not in '%s'", want, why);
		snprintf(want, sizeof(want), "speaks %u", PS_PROTOCOL_VERSION);
		ck_assert_msg(strstr(why, want), "'%s' not in '%s'", want, why);
	}
}
END_TEST

START_TEST(test_reject_unknown_type)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	for (unsigned t = 0; t < 256; t++) {
		good_hdr(b, 0, 0);
		b[5] = (uint8_t)t;
		int rc = decode(b, &big, &h, why, sizeof(why));
		if (t >= 1 && t < PS_MSG_MAX_) {
			ck_assert_msg(rc == 0, "type %u refused: %s", t, why);
		} else {
			ck_assert_msg(rc == PS_EPROTO, "type %u gave %d", t, rc);
			ck_assert_msg(strstr(why, "type"), "reason '%s'", why);
		}
	}
}
END_TEST

START_TEST(test_reject_unknown_flags)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	for (int bit = 0; bit < 16; bit++) {
		good_hdr(b, 0, 0);
		b[6 + bit / 8] = (uint8_t)(1u << (bit % 8));
		int rc = decode(b, &big, &h, why, sizeof(why));
		if ((1u << bit) == PS_FRAME_F_ENC) {
			/* encrypted frames are always authenticated ones */
			ck_assert_int_eq(rc, PS_EPROTO);
			ck_assert_msg(strstr(why, "ENC without flag MAC"), "reason '%s'", why);
			b[6] |= PS_FRAME_F_MAC;
			ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), 0);
			ck_assert_uint_eq(h.flags, PS_FRAME_F_ENC | PS_FRAME_F_MAC);
		} else if ((1u << bit) & PS_FRAME_F_KNOWN) {
			ck_assert_int_eq(rc, 0);
			ck_assert_uint_eq(h.flags, 1u << bit);
		} else {
			ck_assert_msg(rc == PS_EPROTO, "flag bit %d gave %d", bit, rc);
			ck_assert_msg(strstr(why, "flags"), "reason '%s'", why);
		}
	}
}
END_TEST

START_TEST(test_reject_reserved_field)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	for (int byte = 12; byte < 16; byte++) {
		for (unsigned v = 1; v < 256; v <<= 1) {
			good_hdr(b, 0, 0);
			b[byte] = (uint8_t)v;
			ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_EPROTO);
			ck_assert_msg(strstr(why, "reserved"), "reason '%s'", why);
		}
	}
}
END_TEST

START_TEST(test_meta_limit)
{
	const struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 4096 };
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	/* Exactly at the limit: accepted. */
	good_hdr(b, 4096, 0);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), 0);
	ck_assert_uint_eq(h.meta_len, 4096);
	/* One over, and far over: refused, naming both numbers. */
	good_hdr(b, 4097, 0);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	ck_assert_msg(strstr(why, "4097") && strstr(why, "4096"), "reason '%s'", why);
	good_hdr(b, UINT32_MAX, 0);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	/* A limit of 0 allows only empty metadata. */
	const struct ps_wire_limits zero = { .max_frame = 100, .max_meta = 0 };
	good_hdr(b, 0, 100);
	ck_assert_int_eq(decode(b, &zero, &h, why, sizeof(why)), 0);
	good_hdr(b, 1, 0);
	ck_assert_int_eq(decode(b, &zero, &h, why, sizeof(why)), PS_ETOOBIG);
}
END_TEST

START_TEST(test_frame_limit)
{
	const struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 4096 };
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	/* Payload alone exactly at the limit, and meta + payload exactly at it. */
	good_hdr(b, 0, 1 << 20);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), 0);
	ck_assert_uint_eq(h.payload_len, 1 << 20);
	good_hdr(b, 4096, (1 << 20) - 4096);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), 0);
	/* One byte over, either way. */
	good_hdr(b, 0, (1 << 20) + 1);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	ck_assert_msg(strstr(why, "1048577") && strstr(why, "1048576"), "reason '%s'", why);
	good_hdr(b, 4096, (1 << 20) - 4095);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 1, 1 << 20);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	/* Lengths a hostile peer would send. */
	good_hdr(b, 0, 1ull << 40);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 0, UINT64_MAX);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 4096, UINT64_MAX);
	ck_assert_int_eq(decode(b, &lim, &h, why, sizeof(why)), PS_ETOOBIG);
	/* The handshake limits the server uses before hello. */
	const struct ps_wire_limits hs = { .max_frame = PS_WIRE_HANDSHAKE_MAX,
					   .max_meta = PS_WIRE_HANDSHAKE_MAX };
	good_hdr(b, PS_WIRE_HANDSHAKE_MAX, 0);
	ck_assert_int_eq(decode(b, &hs, &h, why, sizeof(why)), 0);
	good_hdr(b, PS_WIRE_HANDSHAKE_MAX, 1);
	ck_assert_int_eq(decode(b, &hs, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 100, PS_WIRE_HANDSHAKE_MAX - 99);
	ck_assert_int_eq(decode(b, &hs, &h, why, sizeof(why)), PS_ETOOBIG);
}
END_TEST

/* meta_len + payload_len must not wrap around 2^64 and pass as small. */
START_TEST(test_length_sum_overflow)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	char why[200];

	/* Limits as large as the types allow: only the wrap can exceed them. */
	good_hdr(b, UINT32_MAX, UINT64_MAX);
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 15, UINT64_MAX - 15); /* sums to exactly UINT64_MAX */
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), 0);
	good_hdr(b, 16, UINT64_MAX - 15);
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 1, UINT64_MAX);
	ck_assert_int_eq(decode(b, &big, &h, why, sizeof(why)), PS_ETOOBIG);
	/* Just below a limit near the top of the range. */
	const struct ps_wire_limits top = { .max_frame = UINT64_MAX - 100, .max_meta = 1000 };
	good_hdr(b, 1000, UINT64_MAX - 1100);
	ck_assert_int_eq(decode(b, &top, &h, why, sizeof(why)), 0);
	good_hdr(b, 1000, UINT64_MAX - 1099);
	ck_assert_int_eq(decode(b, &top, &h, why, sizeof(why)), PS_ETOOBIG);
	good_hdr(b, 1000, UINT64_MAX - 50);
	ck_assert_int_eq(decode(b, &top, &h, why, sizeof(why)), PS_ETOOBIG);
}
END_TEST

/* A tiny or exact reason buffer is never overrun (ASan checks the bytes). */
START_TEST(test_reason_buffer_small)
{
	uint8_t b[PS_WIRE_HDR_LEN];
	struct ps_frame_hdr h;
	const struct ps_wire_limits lim = { .max_frame = 10, .max_meta = 10 };

	for (size_t n = 1; n < 40; n++) {
		char *why = malloc(n);
		good_hdr(b, 11, 0);
		ck_assert_int_eq(ps_wire_decode_hdr(b, &lim, &h, why, n), PS_ETOOBIG);
		ck_assert_uint_lt(strlen(why), n);
		b[0] = 0;
		ck_assert_int_eq(ps_wire_decode_hdr(b, &lim, &h, why, n), PS_EPROTO);
		ck_assert_uint_lt(strlen(why), n);
		free(why);
	}
}
END_TEST

/* Random headers: whatever decode accepts really is within the limits and
 * re-encodes to the same bytes. */
START_TEST(test_random_headers)
{
	const struct ps_wire_limits lim = { .max_frame = 1 << 16, .max_meta = 1 << 12 };
	uint64_t x = 0x9e3779b97f4a7c15ull;
	int accepted = 0;

	for (int i = 0; i < 60000; i++) {
		uint8_t b[PS_WIRE_HDR_LEN], b2[PS_WIRE_HDR_LEN];
		struct ps_frame_hdr h;
		char why[200];
		for (int k = 0; k < PS_WIRE_HDR_LEN; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			b[k] = (uint8_t)x;
		}
		/* Keep most headers close to valid so later checks are reached. */
		if (i % 4) {
			put_le32(b, PS_WIRE_MAGIC);
			b[4] = PS_PROTOCOL_VERSION;
			b[5] = (uint8_t)(1 + b[5] % 10);
			b[6] &= 1;
			b[7] = (i % 8 == 1) ? b[7] : 0;
			put_le32(b + 12, i % 16 == 3 ? 1 : 0);
			put_le32(b + 8, (uint32_t)(x % 5000));
			put_le64(b + 16, i % 3 ? (x >> 20) % 70000 : x);
		}
		if (ps_wire_decode_hdr(b, &lim, &h, why, sizeof(why)) == 0) {
			accepted++;
			ck_assert_uint_le(h.meta_len, lim.max_meta);
			ck_assert_uint_le((uint64_t)h.meta_len + h.payload_len, lim.max_frame);
			ck_assert(h.type >= 1 && h.type < PS_MSG_MAX_);
			ps_wire_encode_hdr(b2, &h);
			ck_assert(memcmp(b, b2, sizeof(b)) == 0);
		} else {
			ck_assert_uint_gt(strlen(why), 0);
		}
	}
	ck_assert_int_gt(accepted, 1000);
}
END_TEST

/* ---- metadata ---- */

static struct ps_frame frame_of(unsigned type, uint8_t *meta, uint32_t len)
{
	struct ps_frame f = { .hdr = { .version = PS_PROTOCOL_VERSION, .type = (uint8_t)type,
				       .meta_len = len },
			      .meta = meta, .payload = meta + len };
	return f;
}

START_TEST(test_unpack_roundtrip)
{
	Ps__SliceRef r1 = PS__SLICE_REF__INIT, r2 = PS__SLICE_REF__INIT, *refs[2] = { &r1, &r2 };
	Ps__Push p = PS__PUSH__INIT;
	Ps__Hello hi = PS__HELLO__INIT;
	uint8_t buf[256];
	char why[200];
	size_t n;

	r1.slice = 7, r1.offset = 0, r1.length = 4096;
	r2.slice = 9, r2.offset = 4096, r2.length = 12;
	p.req_id = 42, p.clock = 1ull << 40, p.end_clock = 1, p.n_slices = 2, p.slices = refs;
	n = ps__push__pack(&p, buf);
	struct ps_frame f = frame_of(PS_MSG_PUSH, buf, (uint32_t)n);
	Ps__Push *q = (Ps__Push *)ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_ptr_nonnull(q);
	ck_assert_ptr_eq(q->base.descriptor, &ps__push__descriptor);
	ck_assert_uint_eq(q->req_id, 42);
	ck_assert_uint_eq(q->clock, 1ull << 40);
	ck_assert(q->end_clock);
	ck_assert_uint_eq(q->n_slices, 2);
	ck_assert_uint_eq(q->slices[1]->slice, 9);
	ck_assert_uint_eq(q->slices[1]->offset, 4096);
	ck_assert_uint_eq(q->slices[1]->length, 12);
	protobuf_c_message_free_unpacked(&q->base, NULL);

	hi.protocol_version = PS_PROTOCOL_VERSION, hi.role = PS__ROLE__ROLE_WORKER, hi.rank = -1;
	hi.shard_map_hash = 0xfedcba9876543210ull, hi.shard = 3, hi.incarnation = 5;
	n = ps__hello__pack(&hi, buf);
	f = frame_of(PS_MSG_HELLO, buf, (uint32_t)n);
	Ps__Hello *h = (Ps__Hello *)ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_ptr_nonnull(h);
	ck_assert_int_eq(h->rank, -1);
	ck_assert_uint_eq(h->shard_map_hash, 0xfedcba9876543210ull);
	protobuf_c_message_free_unpacked(&h->base, NULL);

	/* The frame type picks the schema: the same bytes as a push-ack. */
	n = ps__push__pack(&p, buf);
	f = frame_of(PS_MSG_PUSH_ACK, buf, (uint32_t)n);
	ProtobufCMessage *m = ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_eq(m->descriptor, &ps__push_ack__descriptor);
	ck_assert_uint_eq(((Ps__PushAck *)m)->req_id, 42);
	protobuf_c_message_free_unpacked(m, NULL);
}
END_TEST

/* Empty metadata is a valid protobuf message (all fields default). */
START_TEST(test_unpack_empty)
{
	uint8_t dummy[1];
	char why[200];

	for (unsigned t = 1; t < PS_MSG_MAX_; t++) {
		struct ps_frame f = frame_of(t, dummy, 0);
		ProtobufCMessage *m = ps_msg_unpack(&f, why, sizeof(why));
		ck_assert_msg(m != NULL, "type %u: %s", t, why);
		ck_assert_ptr_eq(m->descriptor, ps_msg_descriptor(t));
		protobuf_c_message_free_unpacked(m, NULL);
	}
}
END_TEST

START_TEST(test_unpack_invalid)
{
	static const struct {
		const char *what;
		uint8_t len;
		uint8_t b[16];
	} bad[] = {
		{ "varint without its value", 1, { 0x08 } },
		{ "varint of 11 bytes", 11, { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					      0xff, 0xff } },
		{ "length past the end", 3, { 0x22, 0x05, 0x01 } },
		{ "length of 2^32", 7, { 0x22, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00 } },
		{ "wire type 7", 2, { 0x0f, 0x00 } },
		{ "field number 0", 2, { 0x00, 0x01 } },
		{ "fixed64 cut short", 5, { 0x09, 1, 2, 3, 4 } },
		{ "fixed32 cut short", 3, { 0x0d, 1, 2 } },
		{ "end group without start", 1, { 0x0c } },
		{ "sub-message that does not decode", 4, { 0x22, 0x02, 0x08, 0xff } },
	};
	char why[200];
	int refused = 0;

	/* Push has every field kind: tag 4 is a repeated sub-message. */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint8_t *copy = malloc(bad[i].len); /* exact size: ASan sees over-reads */
		memcpy(copy, bad[i].b, bad[i].len);
		struct ps_frame f = frame_of(PS_MSG_PUSH, copy, bad[i].len);
		memset(why, 0, sizeof(why));
		ProtobufCMessage *m = ps_msg_unpack(&f, why, sizeof(why));
		ck_assert_msg(m == NULL, "%s: decoded", bad[i].what);
		ck_assert_msg(strstr(why, "push metadata") && strstr(why, "does not decode"),
			      "%s: reason '%s'", bad[i].what, why);
		refused++;
		free(copy);
	}
	ck_assert_int_eq(refused, (int)(sizeof(bad) / sizeof(bad[0])));

	/* A frame type without a schema is refused without reading meta. */
	struct ps_frame f = frame_of(0, NULL, 5);
	ck_assert_ptr_null(ps_msg_unpack(&f, why, sizeof(why)));
	ck_assert_ptr_nonnull(strstr(why, "no metadata schema"));
	f = frame_of(200, NULL, 5);
	ck_assert_ptr_null(ps_msg_unpack(&f, why, sizeof(why)));
}
END_TEST

/* Unpacked metadata costs at most a small multiple of its size: 20,000
 * empty slice entries (2 bytes each on the wire, a struct each once
 * unpacked) are refused, with that reason; honest metadata with as many
 * entries (full slice references, worker clocks, slice ids) unpacks. */
START_TEST(test_unpack_budget)
{
	enum { N = 20000 };
	uint8_t *b = malloc(16 * N);
	char why[300];
	size_t n;

	for (int i = 0; i < N; i++)
		b[2 * i] = 0x22, b[2 * i + 1] = 0x00; /* Push.slices (field 4), empty */
	struct ps_frame f = frame_of(PS_MSG_PUSH, b, 2 * N);
	ck_assert_ptr_null(ps_msg_unpack(&f, why, sizeof(why)));
	ck_assert_msg(strstr(why, "push metadata (40000 bytes) would take more than"), "%s", why);

	/* honest: N full references */
	Ps__SliceRef *refs = calloc(N, sizeof(*refs)), **rp = calloc(N, sizeof(*rp));
	Ps__Push p = PS__PUSH__INIT;
	for (int i = 0; i < N; i++) {
		ps__slice_ref__init(&refs[i]);
		refs[i].slice = (uint32_t)i;
		refs[i].offset = (uint64_t)i * 4096;
		refs[i].length = 4096;
		rp[i] = &refs[i];
	}
	p.n_slices = N;
	p.slices = rp;
	uint8_t *buf = malloc(ps__push__get_packed_size(&p));
	n = ps__push__pack(&p, buf);
	f = frame_of(PS_MSG_PUSH, buf, (uint32_t)n);
	Ps__Push *q = (Ps__Push *)ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_msg(q != NULL, "%s", why);
	ck_assert_uint_eq(q->n_slices, N);
	ck_assert_uint_eq(q->slices[N - 1]->offset, (uint64_t)(N - 1) * 4096);
	protobuf_c_message_free_unpacked(&q->base, NULL);
	free(buf);

	/* honest: a Stats reply with N workers' clocks, a Pull of N slices */
	Ps__WorkerClock *wc = calloc(N, sizeof(*wc)), **wp = calloc(N, sizeof(*wp));
	Ps__Stats st = PS__STATS__INIT;
	for (int i = 0; i < N; i++) {
		ps__worker_clock__init(&wc[i]);
		wc[i].rank = i;
		wc[i].clock = 7;
		wp[i] = &wc[i];
	}
	st.n_workers = N;
	st.workers = wp;
	buf = malloc(ps__stats__get_packed_size(&st));
	n = ps__stats__pack(&st, buf);
	f = frame_of(PS_MSG_STATS, buf, (uint32_t)n);
	ProtobufCMessage *m = ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_msg(m != NULL, "%s", why);
	protobuf_c_message_free_unpacked(m, NULL);
	free(buf);
	uint32_t *ids = calloc(N, sizeof(*ids));
	Ps__Pull pl = PS__PULL__INIT;
	pl.n_slices = N;
	pl.slices = ids;
	buf = malloc(ps__pull__get_packed_size(&pl));
	n = ps__pull__pack(&pl, buf);
	f = frame_of(PS_MSG_PULL, buf, (uint32_t)n);
	m = ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_msg(m != NULL, "%s", why);
	protobuf_c_message_free_unpacked(m, NULL);
	free(buf);
	free(ids);
	free(wc);
	free(wp);
	free(refs);
	free(rp);
	free(b);
}
END_TEST

/* Random bytes as every type's metadata: NULL or a message, never a crash
 * or a leak (ASan). */
START_TEST(test_unpack_fuzz)
{
	uint64_t x = 12345;
	int refused = 0, decoded = 0;
	char why[200];

	for (int i = 0; i < 12000; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		uint32_t len = (uint32_t)(x % 64);
		uint8_t *b = malloc(len ? len : 1);
		for (uint32_t k = 0; k < len; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			b[k] = (uint8_t)x;
			/* Plausible tags now and then so decoding gets deep. */
			if (k % 5 == 0 && i % 2)
				b[k] = (uint8_t)((1 + x % 6) << 3 | (x >> 8) % 3);
		}
		struct ps_frame f = frame_of(1 + (unsigned)(i % 9), b, len);
		ProtobufCMessage *m = ps_msg_unpack(&f, why, sizeof(why));
		if (m) {
			decoded++;
			protobuf_c_message_free_unpacked(m, NULL);
		} else {
			refused++;
		}
		free(b);
	}
	ck_assert_int_gt(refused, 1000);
	ck_assert_int_gt(decoded, 100);
}
END_TEST

/* ---- ps_msg_send through a recording transport ---- */

static struct {
	int calls;
	uint8_t type;
	uint8_t meta[8192];
	uint32_t meta_len;
	int npayload;
	const struct ps_iov *payload;
	unsigned flags;
	ps_send_cb cb;
	void *arg;
	int rc;
} rec;

static int rec_send(struct ps_conn *c, uint8_t type, const void *meta, uint32_t meta_len,
		    const struct ps_iov *payload, int npayload, unsigned flags, ps_send_cb cb,
		    void *arg)
{
	(void)c;
	rec.calls++;
	rec.type = type;
	ck_assert_uint_le(meta_len, sizeof(rec.meta));
	memcpy(rec.meta, meta, meta_len);
	rec.meta_len = meta_len;
	rec.payload = payload;
	rec.npayload = npayload;
	rec.flags = flags;
	rec.cb = cb;
	rec.arg = arg;
	return rec.rc;
}

static const struct ps_transport_ops rec_ops = { .name = "record", .send = rec_send };

static void dummy_cb(struct ps_conn *c, int status, void *arg)
{
	(void)c, (void)status, (void)arg;
}

START_TEST(test_msg_send)
{
	struct ps_transport t = { .ops = &rec_ops };
	struct ps_conn c = { .t = &t };
	Ps__PullReply r = PS__PULL_REPLY__INIT;
	Ps__SliceRef refs[100], *ptrs[100];
	struct ps_iov iov[2] = { { "ab", 2 }, { "cde", 3 } };
	char why[200];
	int arg;

	memset(&rec, 0, sizeof(rec));
	r.req_id = 77;
	/* Small metadata (stack buffer) then large (heap buffer, > 512 bytes). */
	for (int n = 1; n <= 100; n += 99) {
		for (int i = 0; i < n; i++) {
			ps__slice_ref__init(&refs[i]);
			refs[i].slice = (uint32_t)i;
			refs[i].offset = (uint64_t)i << 33;
			refs[i].length = 1ull << 33;
			ptrs[i] = &refs[i];
		}
		r.n_slices = (size_t)n;
		r.slices = ptrs;
		rec.calls = 0;
		ck_assert_int_eq(ps_msg_send(&c, PS_MSG_PULL_REPLY, &r.base, iov, 2, PS_SEND_STABLE,
					     dummy_cb, &arg),
				 0);
		ck_assert_int_eq(rec.calls, 1);
		ck_assert_uint_eq(rec.type, PS_MSG_PULL_REPLY);
		ck_assert_uint_eq(rec.meta_len, protobuf_c_message_get_packed_size(&r.base));
		if (n == 100)
			ck_assert_uint_gt(rec.meta_len, 512);
		ck_assert_ptr_eq(rec.payload, iov);
		ck_assert_int_eq(rec.npayload, 2);
		ck_assert_uint_eq(rec.flags, PS_SEND_STABLE);
		ck_assert_ptr_eq(rec.cb, dummy_cb);
		ck_assert_ptr_eq(rec.arg, &arg);
		struct ps_frame f = frame_of(PS_MSG_PULL_REPLY, rec.meta, rec.meta_len);
		Ps__PullReply *q = (Ps__PullReply *)ps_msg_unpack(&f, why, sizeof(why));
		ck_assert_ptr_nonnull(q);
		ck_assert_uint_eq(q->req_id, 77);
		ck_assert_uint_eq(q->n_slices, (size_t)n);
		ck_assert_uint_eq(q->slices[n - 1]->offset, (uint64_t)(n - 1) << 33);
		protobuf_c_message_free_unpacked(&q->base, NULL);
	}
	/* The transport's refusal is passed back as is. */
	rec.rc = PS_ECLOSED;
	ck_assert_int_eq(ps_msg_send(&c, PS_MSG_PULL_REPLY, &r.base, NULL, 0, PS_SEND_VOLATILE,
				     NULL, NULL),
			 PS_ECLOSED);
	rec.rc = 0;
}
END_TEST

START_TEST(test_msg_send_error)
{
	struct ps_transport t = { .ops = &rec_ops };
	struct ps_conn c = { .t = &t };
	char why[200], longtext[2000];

	memset(&rec, 0, sizeof(rec));
	ck_assert_int_eq(ps_msg_send_error(&c, 9, PS_ESHAPE, "slice %u: %s", 12u, "bad"), 0);
	ck_assert_int_eq(rec.calls, 1);
	ck_assert_uint_eq(rec.type, PS_MSG_ERROR);
	ck_assert_uint_eq(rec.flags, PS_SEND_VOLATILE);
	ck_assert_ptr_null(rec.cb);
	ck_assert_int_eq(rec.npayload, 0);
	struct ps_frame f = frame_of(PS_MSG_ERROR, rec.meta, rec.meta_len);
	Ps__Error *e = (Ps__Error *)ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(e->req_id, 9);
	ck_assert_int_eq(e->code, PS_ESHAPE); /* sint32: negative codes survive */
	ck_assert_str_eq(e->message, "slice 12: bad");
	protobuf_c_message_free_unpacked(&e->base, NULL);

	/* A long message is cut, not overrun. */
	memset(longtext, 'z', sizeof(longtext) - 1);
	longtext[sizeof(longtext) - 1] = '\0';
	ck_assert_int_eq(ps_msg_send_error(&c, 1, -EINVAL, "%s", longtext), 0);
	f = frame_of(PS_MSG_ERROR, rec.meta, rec.meta_len);
	e = (Ps__Error *)ps_msg_unpack(&f, why, sizeof(why));
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->code, -EINVAL);
	ck_assert_uint_gt(strlen(e->message), 100);
	ck_assert_uint_lt(strlen(e->message), sizeof(longtext) - 1);
	protobuf_c_message_free_unpacked(&e->base, NULL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("wire");
	TCase *hdr = tcase_create("header"), *meta = tcase_create("metadata");
	int failed;

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(hdr, 60);
	tcase_add_test(hdr, test_encode_layout);
	tcase_add_test(hdr, test_roundtrip_every_type);
	tcase_add_test(hdr, test_type_names);
	tcase_add_test(hdr, test_reject_bad_magic);
	tcase_add_test(hdr, test_reject_bad_version);
	tcase_add_test(hdr, test_reject_unknown_type);
	tcase_add_test(hdr, test_reject_unknown_flags);
	tcase_add_test(hdr, test_reject_reserved_field);
	tcase_add_test(hdr, test_mac_flag_and_seq);
	tcase_add_test(hdr, test_meta_limit);
	tcase_add_test(hdr, test_frame_limit);
	tcase_add_test(hdr, test_length_sum_overflow);
	tcase_add_test(hdr, test_reason_buffer_small);
	tcase_add_test(hdr, test_random_headers);
	tcase_add_test(meta, test_unpack_roundtrip);
	tcase_add_test(meta, test_unpack_empty);
	tcase_add_test(meta, test_unpack_invalid);
	tcase_add_test(meta, test_unpack_budget);
	tcase_add_test(meta, test_unpack_fuzz);
	tcase_add_test(meta, test_msg_send);
	tcase_add_test(meta, test_msg_send_error);
	suite_add_tcase(s, hdr);
	suite_add_tcase(s, meta);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
