/* fuzz_hello.c - libFuzzer target: the handshake as a shard sees it. The
 * input is a Hello frame's metadata; it is unpacked and judged by
 * ps_hello_check (server/handshake.c), the function ps-server uses, against
 * a 2-shard, 3-worker config. A refusal must come with a reason; an
 * acceptance must be for a known role, a rank in range and matching
 * version, map hash and shard. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "handshake.h"
#include "ps_err.h"
#include "shardmap.h"
#include "wire.h"

static struct ps_config cfg;
static struct ps_shardmap map;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[512];

	(void)argc;
	(void)argv;
	if (ps_config_load_string(&cfg,
				  "cluster:\n  servers: [127.0.0.1:7000, 127.0.0.1:7001]\n"
				  "  workers: 3\nmodel:\n  tensors:\n    - {name: a, shape: [5000]}\n",
				  "fuzz.yaml", err, sizeof(err)) ||
	    ps_shardmap_init(&map, &cfg))
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Ps__Hello built = PS__HELLO__INIT, *h = &built, *unpacked = NULL;
	char err[400] = "";
	int shard;

	if (size == 0)
		return 0;
	if (data[0] == 0xff) {
		h = unpacked = ps__hello__unpack(NULL, size - 1, data + 1);
		if (!h)
			return 0;
		shard = size > 1 ? data[1] % 2 : 0;
	} else {
		uint8_t b[16] = { 0 };

		memcpy(b, data, size < sizeof(b) ? size : sizeof(b));
		shard = b[0] & 1;
		built.protocol_version = (b[0] & 2) ? PS_PROTOCOL_VERSION : b[1];
		built.role = (Ps__Role)(b[2] % 4);
		built.rank = (int8_t)b[3];
		built.shard = (b[0] & 4) ? shard : (int8_t)b[4];
		if (b[0] & 8)
			built.shard_map_hash = map.hash;
		else
			memcpy(&built.shard_map_hash, b + 8, 8);
	}
	if (ps_hello_check(&cfg, map.hash, shard, h, err, sizeof(err)) == 0) {
		if (h->protocol_version != PS_PROTOCOL_VERSION || h->shard_map_hash != map.hash ||
		    h->shard != shard ||
		    (h->role != PS__ROLE__ROLE_WORKER && h->role != PS__ROLE__ROLE_STAT) ||
		    (h->role == PS__ROLE__ROLE_WORKER && (h->rank < 0 || h->rank >= 3)))
			abort(); /* accepted what it must refuse */
	} else if (!err[0]) {
		abort(); /* refused without a reason */
	}
	if (unpacked)
		ps__hello__free_unpacked(unpacked, NULL);
	return 0;
}
