/* cworker.c - a C worker of the Python tests (built by test_interop.py
 * against libps.so): the same integer-valued gradients as sums.py, for
 * each clock a push that ends it and a pull of that clock's weights.
 *   cworker CONFIG RANK CLOCKS */
#include <stdio.h>
#include <stdlib.h>
#include "ps_client.h"

int main(int argc, char **argv)
{
	struct ps_config *cfg;
	struct ps_client *c;
	char err[1024];
	int rank, clocks, nt, rc;

	if (argc != 4)
		return 2;
	rank = atoi(argv[2]);
	clocks = atoi(argv[3]);
	if (ps_config_open(&cfg, argv[1], err, sizeof(err)) ||
	    ps_client_init(&c, cfg, rank, err, sizeof(err))) {
		fprintf(stderr, "cworker: %s\n", err);
		return 1;
	}
	nt = ps_config_ntensors(cfg);
	struct ps_tensor g[64], w[64];
	for (int i = 0; i < nt && i < 64; i++) {
		int64_t n = ps_config_tensor_count(cfg, i);
		g[i] = ps_tensor_of(cfg, i, malloc(sizeof(float) * (size_t)n));
		w[i] = ps_tensor_of(cfg, i, malloc(sizeof(float) * (size_t)n));
	}
	for (int k = 0; k < clocks; k++) {
		for (int i = 0; i < nt; i++)
			for (int64_t j = 0; j < g[i].count; j++)
				g[i].data[j] = (float)(j % 7 + (rank + 1) + 3 * k + i);
		rc = ps_client_wait(c, ps_client_push(c, (uint64_t)k, g, nt, PS_PUSH_END_CLOCK));
		if (!rc)
			rc = ps_client_wait(c, ps_client_pull(c, (uint64_t)k + 1, w, nt));
		if (rc) {
			fprintf(stderr, "cworker: clock %d: %s: %s\n", k, ps_strerror(rc),
				ps_client_error(c));
			return 1;
		}
	}
	printf("cworker %d done\n", rank);
	for (int i = 0; i < nt; i++) {
		free(g[i].data);
		free(w[i].data);
	}
	ps_client_free(c);
	ps_config_close(cfg);
	return 0;
}
