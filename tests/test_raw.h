/* test_raw.h - a worker connection spoken by hand, frame by frame (the
 * shard with security.auth off): what a test needs to send requests the
 * client library would never send, and read each answer. */
#ifndef TEST_RAW_H
#define TEST_RAW_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <check.h>
#include "config.h"
#include "config_agree.h"
#include "msg.h"
#include "ps_err.h"
#include "shardmap.h"
#include "test_util.h"
#include "wire.h"

/* A connection to 127.0.0.1:port (tried for 10 s), or -1. */
static inline int tu_raw_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	for (int i = 0; i < 100; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			return fd;
		if (fd >= 0)
			close(fd);
		tu_sleep_ms(100);
	}
	return -1;
}

/* One frame: type, message m, plen payload bytes. 0 or -1. */
static inline int tu_raw_send(int fd, uint8_t type, const ProtobufCMessage *m, const void *pay,
			      size_t plen)
{
	size_t mlen = protobuf_c_message_get_packed_size(m);
	uint8_t *b = malloc(PS_WIRE_HDR_LEN + mlen + plen);
	struct ps_frame_hdr h = { .version = PS_PROTOCOL_VERSION, .type = type,
				  .meta_len = (uint32_t)mlen, .payload_len = plen };
	size_t len = PS_WIRE_HDR_LEN + mlen + plen, off = 0;

	if (!b)
		return -1;
	ps_wire_encode_hdr(b, &h);
	protobuf_c_message_pack(m, b + PS_WIRE_HDR_LEN);
	if (plen)
		memcpy(b + PS_WIRE_HDR_LEN + mlen, pay, plen);
	while (off < len) {
		ssize_t k = write(fd, b + off, len - off);
		if (k <= 0) {
			free(b);
			return -1;
		}
		off += (size_t)k;
	}
	free(b);
	return 0;
}

/* Exactly n bytes, each read within 5 s (scaled); 0 or -1. */
static inline int tu_raw_read(int fd, void *b, size_t n)
{
	for (size_t got = 0; got < n;) {
		struct pollfd p = { fd, POLLIN, 0 };
		if (poll(&p, 1, (int)(5000 * tu_time_scale())) != 1)
			return -1;
		ssize_t k = read(fd, (uint8_t *)b + got, n - got);
		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

/* The next frame's type and message (NULL when the connection is gone);
 * with pay, its payload (malloc'd, *plen bytes) too. */
static inline ProtobufCMessage *tu_raw_recv_pay(int fd, unsigned *type, uint8_t **pay,
						size_t *plen)
{
	uint8_t h[PS_WIRE_HDR_LEN], *body;
	struct ps_wire_limits lim = { .max_frame = 1 << 26, .max_meta = 1 << 20 };
	struct ps_frame f = { 0 };
	char why[200];
	ProtobufCMessage *m;

	if (tu_raw_read(fd, h, sizeof(h)) ||
	    ps_wire_decode_hdr(h, &lim, &f.hdr, why, sizeof(why)))
		return NULL;
	body = malloc(f.hdr.meta_len + f.hdr.payload_len + 1);
	if (!body || tu_raw_read(fd, body, f.hdr.meta_len + f.hdr.payload_len)) {
		free(body);
		return NULL;
	}
	f.meta = body;
	f.payload = body + f.hdr.meta_len;
	*type = f.hdr.type;
	m = ps_msg_unpack(&f, why, sizeof(why));
	if (pay) {
		*pay = malloc(f.hdr.payload_len + 1);
		if (*pay)
			memcpy(*pay, f.payload, f.hdr.payload_len);
		*plen = f.hdr.payload_len;
	}
	free(body);
	return m;
}

static inline ProtobufCMessage *tu_raw_recv(int fd, unsigned *type)
{
	return tu_raw_recv_pay(fd, type, NULL, NULL);
}

/* A worker's Hello as rank on shard of cfg (map: its shard map), answered
 * ok; the connection. */
static inline int tu_raw_join(int port, const struct ps_config *cfg,
			      const struct ps_shardmap *map, int shard, int rank)
{
	static char settings[PS_AGREE_MAX];
	Ps__Hello h = PS__HELLO__INIT;
	unsigned t;
	int fd = tu_raw_connect(port);

	ck_assert_int_ge(fd, 0);
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = PS__ROLE__ROLE_WORKER;
	h.rank = rank;
	h.shard_map_hash = map->hash;
	h.shard = (uint32_t)shard;
	h.incarnation = 77;
	ps_config_agreement(cfg, settings, sizeof(settings));
	h.settings = settings;
	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_HELLO, &h.base, NULL, 0), 0);
	ProtobufCMessage *r = tu_raw_recv(fd, &t);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(t, PS_MSG_HELLO_REPLY);
	ck_assert_msg(((Ps__HelloReply *)r)->ok, "%s", ((Ps__HelloReply *)r)->error);
	protobuf_c_message_free_unpacked(r, NULL);
	return fd;
}

/* Sends a request and expects an Error with code whose message holds
 * words and, when given, words2. */
static inline void tu_raw_expect_error(int fd, uint8_t type, const ProtobufCMessage *m,
				       const void *pay, size_t plen, int code, const char *words,
				       const char *words2)
{
	unsigned t = 0;
	ProtobufCMessage *r;

	ck_assert_int_eq(tu_raw_send(fd, type, m, pay, plen), 0);
	r = tu_raw_recv(fd, &t);
	ck_assert_msg(r != NULL, "no answer (connection closed?) expecting '%s'", words);
	ck_assert_msg(t == PS_MSG_ERROR, "got a %s frame, expected an error about '%s'",
		      ps_wire_type_name(t), words);
	ck_assert_msg(((Ps__Error *)r)->code == code, "code %d (%s), expected %d, for '%s'",
		      ((Ps__Error *)r)->code, ((Ps__Error *)r)->message, code, words);
	ck_assert_msg(strstr(((Ps__Error *)r)->message, words) &&
		      (!words2 || strstr(((Ps__Error *)r)->message, words2)),
		      "'%s' does not say '%s'%s%s", ((Ps__Error *)r)->message, words,
		      words2 ? " and " : "", words2 ? words2 : "");
	protobuf_c_message_free_unpacked(r, NULL);
}

#endif
