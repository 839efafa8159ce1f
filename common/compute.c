/* compute.c - finding compute backends by name (docs/architecture.md,
 * Interfaces): "cpu" (oneDNN) and "ref" (the reference) are built in,
 * "cuda" is the plug-in
 * ps-compute-cuda.so, opened with dlopen the first time it is asked for.
 *
 * Why a plug-in: the cuda backend links cuDNN, cuBLAS and the CUDA runtime.
 * Linked into ps-worker they would stop it from starting at all on a
 * machine without them, --device cpu included. Opened at run time, their
 * absence is one line saying why, and the worker goes on on the CPU where
 * the config allows.
 *
 * Also here: reading softmax_xent's stats, shared by every backend.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "compute.h"
#include "ps_err.h"

#define PLUGIN_NAME "ps-compute-cuda.so"

/* Where `make install` puts the plug-in (the Makefile passes PREFIX/lib/ps). */
#ifndef PS_PLUGIN_INSTALL_DIR
#define PS_PLUGIN_INSTALL_DIR "/usr/local/lib/ps"
#endif

static pthread_mutex_t plugin_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct ps_compute_ops *plugin_ops;   /* once loaded; never unloaded */
static char plugin_err[512];                      /* why it could not be, once tried */
static int plugin_tried;

/* The folder of the running program (bin/ for ps-worker), or "" . */
static void exe_dir(char *out, size_t len)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	char *slash;

	out[0] = '\0';
	if (n <= 0)
		return;
	path[n] = '\0';
	slash = strrchr(path, '/');
	if (!slash)
		return;
	*slash = '\0';
	snprintf(out, len, "%s", path);
}

/* Tries one candidate file. 1 loaded, 0 not there, -1 there but unusable
 * (the reason in plugin_err). */
static int try_plugin(const char *path)
{
	const struct ps_compute_plugin *p;
	void *h;

	if (access(path, F_OK) != 0)
		return 0;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		/* dlerror names the library that is missing (libcudnn.so.9, ...) */
		snprintf(plugin_err, sizeof(plugin_err), "cannot load %s: %s", path, dlerror());
		return -1;
	}
	p = dlsym(h, PS_COMPUTE_PLUGIN_SYMBOL);
	if (!p || !p->ops) {
		snprintf(plugin_err, sizeof(plugin_err), "%s is not a compute plug-in (no %s)",
			 path, PS_COMPUTE_PLUGIN_SYMBOL);
		dlclose(h);
		return -1;
	}
	if (p->abi != PS_COMPUTE_ABI) {
		snprintf(plugin_err, sizeof(plugin_err),
			 "%s was built for compute interface %d, this program has %d: rebuild "
			 "it with this version", path, p->abi, PS_COMPUTE_ABI);
		dlclose(h);
		return -1;
	}
	plugin_ops = p->ops;  /* the handle stays open for the process's life */
	return 1;
}

/* Looks in PS_COMPUTE_PLUGIN_DIR, then lib/ beside the program's folder
 * (a build tree or an install prefix), then the install path. */
static void load_plugin(void)
{
	char dirs[4][PATH_MAX], path[PATH_MAX], tried[1024] = "";
	const char *env = getenv("PS_COMPUTE_PLUGIN_DIR");
	int nd = 0, rc;

	if (env && *env)
		snprintf(dirs[nd++], PATH_MAX, "%s", env);
	exe_dir(path, sizeof(path));
	if (path[0]) {
		snprintf(dirs[nd++], PATH_MAX, "%.2000s/../lib", path);
		snprintf(dirs[nd++], PATH_MAX, "%.2000s/../lib/ps", path);
	}
	snprintf(dirs[nd++], PATH_MAX, "%s", PS_PLUGIN_INSTALL_DIR);
	for (int i = 0; i < nd; i++) {
		snprintf(path, sizeof(path), "%.3000s/%s", dirs[i], PLUGIN_NAME);
		rc = try_plugin(path);
		if (rc)
			return;  /* loaded, or found but unusable: that reason stands */
		size_t used = strlen(tried);
		snprintf(tried + used, sizeof(tried) - used, "%s%.200s", used ? ", " : "", dirs[i]);
	}
	snprintf(plugin_err, sizeof(plugin_err),
		 "this installation has no CUDA plug-in (%s not in %s; it is built only where "
		 "nvcc and cuDNN are found)", PLUGIN_NAME, tried);
}

int ps_compute_load(const char *name, const struct ps_compute_ops **ops, char *err,
		    size_t errlen)
{
	*ops = NULL;
	if (name && strcmp(name, "cpu") == 0) {
		*ops = &ps_compute_cpu_ops;
		return 0;
	}
	if (name && strcmp(name, "ref") == 0) {
		*ops = &ps_compute_ref_ops;
		return 0;
	}
	if (!name || strcmp(name, "cuda") != 0) {
		if (err && errlen)
			snprintf(err, errlen, "no compute backend named '%s' (cpu, ref, cuda)",
				 name ? name : "(null)");
		return -ENOENT;
	}
	pthread_mutex_lock(&plugin_mu);
	if (!plugin_tried) {
		load_plugin();
		plugin_tried = 1;
	}
	*ops = plugin_ops;
	if (!*ops && err && errlen)
		snprintf(err, errlen, "%s", plugin_err);
	pthread_mutex_unlock(&plugin_mu);
	return *ops ? 0 : PS_ENOTSUP;
}

int ps_compute_xent_read(const struct ps_xent_stats *st, int classes, float *loss, int *correct,
			 char *err, size_t errlen)
{
	if (st->bad_row >= 0) {
		snprintf(err, errlen, "softmax_xent: label %d of example %d is outside [0, %d)",
			 st->bad_label, st->bad_row, classes);
		return -EINVAL;
	}
	*loss = st->n > 0 ? (float)(st->loss_sum / st->n) : NAN;
	*correct = st->correct;
	if (!isfinite(st->loss_sum)) {
		snprintf(err, errlen, "softmax_xent: loss is not finite (NaN or infinite logits)");
		return PS_ENOFINITE;
	}
	return 0;
}

int ps_compute_xent(struct ps_compute *c, const float *logits, const int32_t *labels, int n,
		    int classes, float *dlogits, float *loss, int *correct)
{
	const struct ps_compute_ops *ops = c->ops;
	struct ps_xent_stats *st = ops->host_alloc(c, sizeof(*st));
	int rc;

	if (!st)
		return -ENOMEM;
	rc = ops->softmax_xent(c, logits, labels, n, classes, dlogits, st);
	if (!rc)
		rc = ops->sync(c);
	if (!rc)
		rc = ps_compute_xent_read(st, classes, loss, correct, c->err, sizeof(c->err));
	ops->host_free(c, st);
	return rc;
}
