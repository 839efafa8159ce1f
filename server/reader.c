/* reader.c - what a reader's connection may not do (docs/security.md,
 * "The reader key"). A reader (Hello ROLE_READER) proved the reader key,
 * not the cluster secret (conn.c): it may pull and read stats, and every
 * request that would change the shard is refused here, before the
 * handlers that would apply it see it.
 */
#include <inttypes.h>
#include <stdio.h>
#include "msg.h"
#include "ps_err.h"
#include "ps_log.h"
#include "server.h"
#include "server_int.h"
#include "wire.h"

/* A reader's request that would change the shard (push, row push,
 * declare, a checkpoint or a resume clock in a stats request): answered
 * with an Error naming it, counted (reader_refused), logged; nothing is
 * applied and the connection stays open. Returns 1 when refused. */
int ps__srv_reader_refuses(struct ps_server *s, struct ps_srv_conn *sc, int type,
			   const ProtobufCMessage *m)
{
	const char *what = NULL;
	uint64_t req_id = 0;

	switch (type) {
	case PS_MSG_PUSH:
		what = "push";
		req_id = ((const Ps__Push *)m)->req_id;
		break;
	case PS_MSG_PUSH_ROWS:
		what = "row push";
		req_id = ((const Ps__PushRows *)m)->req_id;
		break;
	case PS_MSG_DECLARE:
		what = "declare";
		req_id = ((const Ps__Declare *)m)->req_id;
		break;
	case PS_MSG_STATS_REQUEST: {
		const Ps__StatsRequest *r = (const Ps__StatsRequest *)m;
		if (r->checkpoint)
			what = "checkpoint";
		else if (r->resume_clock)
			what = "resume clock";
		req_id = r->req_id;
		break;
	}
	default:
		break;
	}
	if (!what)
		return 0;
	s->c.reader_refused++;
	if (s->c.reader_refused <= 16 || !(s->c.reader_refused & (s->c.reader_refused - 1)))
		ps_warn("reader %s: %s refused (a reader may only pull; %" PRIu64 " refused so far)",
			sc->conn->peer, what, s->c.reader_refused);
	ps_msg_send_error(sc->conn, req_id, PS_EREFUSED, "a reader may only pull: %s refused",
			  what);
	return 1;
}
