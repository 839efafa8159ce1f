/* version.c - the text of every program's --version (version.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ps_client.h"
#include "transport_rdma.h"
#include "version.h"
#include "wire.h"

#define PLUGIN_NAME "ps-compute-cuda.so"

/* Where `make install` puts the plug-in (the Makefile passes PREFIX/lib/ps,
 * as for common/compute.c, which opens it). */
#ifndef PS_PLUGIN_INSTALL_DIR
#define PS_PLUGIN_INSTALL_DIR "/usr/local/lib/ps"
#endif

int ps__plugin_find(char *out, size_t len)
{
	char exe[PATH_MAX], dirs[4][PATH_MAX], path[PATH_MAX + 32];
	const char *env = getenv("PS_COMPUTE_PLUGIN_DIR");
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int nd = 0;

	if (env && *env)
		snprintf(dirs[nd++], PATH_MAX, "%.2000s", env);
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = '\0';
			snprintf(dirs[nd++], PATH_MAX, "%.2000s/../lib", exe);
			snprintf(dirs[nd++], PATH_MAX, "%.2000s/../lib/ps", exe);
		}
	}
	snprintf(dirs[nd++], PATH_MAX, "%s", PS_PLUGIN_INSTALL_DIR);
	out[0] = '\0';
	for (int i = 0; i < nd; i++) {
		snprintf(path, sizeof(path), "%.2000s/%s", dirs[i], PLUGIN_NAME);
		char real[PATH_MAX];
		if (access(path, R_OK) == 0) {
			snprintf(out, len, "%s", realpath(path, real) ? real : path);
			return 1;
		}
		size_t used = strlen(out);
		snprintf(out + used, len - used, "%s%s", used ? ", " : "", dirs[i]);
	}
	return 0;
}

void ps__version_print(FILE *f, const char *prog)
{
	char where[2048], why[512];

	fprintf(f, "%s %s\n", prog, ps_version());
	fprintf(f, "wire protocol %d\n", PS_PROTOCOL_VERSION);
	int rdma = ps_rdma_probe("", why, sizeof(why));
	char *advice = strstr(why, "; use transport: tcp");
	if (advice)
		*advice = '\0';  /* the advice is for a config that asks for rdma */
	if (rdma == 0)
		fprintf(f, "transports: tcp, rdma (verbs, rdma_cm; here: %s)\n", why);
	else
		fprintf(f, "transports: tcp, rdma (verbs, rdma_cm; not usable here: %s)\n", why);
	if (ps__plugin_find(where, sizeof(where)))
		fprintf(f, "cuda plug-in: %s\n", where);
	else
		fprintf(f, "cuda plug-in: absent (not in %s; built only where nvcc and cuDNN are "
			   "found)\n", where);
}
