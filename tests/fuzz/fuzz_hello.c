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
	Ps__Hello *h = ps__hello__unpack(NULL, size, data);
	char err[400] = "";
	int shard;

	if (!h)
		return 0;
	shard = size ? data[0] % 2 : 0;
	if (ps_hello_check(&cfg, map.hash, shard, h, err, sizeof(err)) == 0) {
		if (h->protocol_version != PS_PROTOCOL_VERSION || h->shard_map_hash != map.hash ||
		    h->shard != shard ||
		    (h->role != PS__ROLE__ROLE_WORKER && h->role != PS__ROLE__ROLE_STAT) ||
		    (h->role == PS__ROLE__ROLE_WORKER && (h->rank < 0 || h->rank >= 3)))
			abort(); /* accepted what it must refuse */
	} else if (!err[0]) {
		abort(); /* refused without a reason */
	}
	ps__hello__free_unpacked(h, NULL);
	return 0;
}
