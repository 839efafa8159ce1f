/* client.c - ps._ps.Client: one connection to every shard of a config, as
 * worker rank R or as a monitor (rank -1). arrays.c turns the arguments
 * into libps's tensors.
 *
 * Every method checks the client is open and used in the process that
 * connected it (a forked child gets ps.ForkError: the connections and the
 * I/O thread belong to the parent), takes the arrays through the buffer
 * protocol without copying (float32, C-contiguous, the size the config
 * gives; refused naming the tensor and what was expected), then submits
 * and waits with the GIL released. The *_async forms return a ps.Handle
 * that keeps the arrays alive until the call completes.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <string.h>
#include <unistd.h>
#include "pyps.h"

PyTypeObject *pyps_ClientType;

/* ---- use and close ---- */

int pyps_client_enter(pyps_client *self)
{
	if (self->pid != getpid() && self->c) {
		pyps_raise(PS_ESTATE, "this client was connected by process %d and cannot be used "
			   "after fork() (process %d): create a new Client in the child, or "
			   "start workers with the 'spawn' or 'forkserver' method", (int)self->pid,
			   (int)getpid());
		return -1;
	}
	if (!self->c || self->closed) {
		pyps_raise(PS_ESTATE, self->closed ? "the client is closed" :
			   "the client is not connected");
		return -1;
	}
	self->busy++;
	return 0;
}

/* Frees c (GIL released: the I/O thread is joined). */
static void free_client(pyps_client *self)
{
	struct ps_client *c = self->c;

	self->c = NULL;
	if (!c || self->pid != getpid())
		return; /* a forked child must not touch the parent's threads */
	Py_BEGIN_ALLOW_THREADS
	ps_client_free(c);
	Py_END_ALLOW_THREADS
}

void pyps_client_leave(pyps_client *self)
{
	if (--self->busy == 0 && self->closed)
		free_client(self);
}

void pyps_client_errtext(pyps_client *self, char *buf, size_t len)
{
	const char *e = self->c ? ps_client_error(self->c) : NULL;

	snprintf(buf, len, "%s", e && *e ? e : "(no detail)");
}

static int client_init(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "config", "rank", NULL };
	PyObject *config;
	struct ps_client *c = NULL;
	char err[1024];
	int rank, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!i:Client", kwlist, pyps_ConfigType,
					 &config, &rank))
		return -1;
	if (self->c || self->config) {
		pyps_raise(PS_ESTATE, "Client.__init__ called twice");
		return -1;
	}
	if (!((pyps_config *)config)->cfg) {
		pyps_raise(PS_ESTATE, "the Config was not opened");
		return -1;
	}
	if (rank < PS_RANK_READER) {
		pyps_raise(-EINVAL, "rank %d: a worker rank is 0 or more, -1 is a monitor, -2 a "
			   "reader", rank);
		return -1;
	}
	err[0] = 0;
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_init(&c, ((pyps_config *)config)->cfg, rank, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (rc) {
		pyps_raise(rc, "%s", err[0] ? err : ps_strerror(rc));
		return -1;
	}
	self->c = c;
	Py_INCREF(config);
	self->config = (pyps_config *)config;
	self->rank = rank;
	self->pid = getpid();
	return 0;
}

static void client_dealloc(pyps_client *self)
{
	PyTypeObject *tp = Py_TYPE((PyObject *)self);
	freefunc tp_free = PyType_GetSlot(tp, Py_tp_free);

	/* busy is 0 here: every handle holds a reference */
	self->closed = 1;
	free_client(self);
	Py_XDECREF((PyObject *)self->config);
	tp_free(self);
	Py_DECREF(tp);
}

static PyObject *client_close(pyps_client *self, PyObject *noarg)
{
	(void)noarg;
	self->closed = 1;
	if (self->busy == 0)
		free_client(self);
	Py_RETURN_NONE;
}

/* ---- dense calls ---- */

static int get_u64(PyObject *o, uint64_t dflt, uint64_t *out)
{
	if (!o || o == Py_None) {
		*out = dflt;
		return 0;
	}
	*out = PyLong_AsUnsignedLongLong(o);
	return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Fails the call that got rc (< 0) from libps. */
PyObject *pyps_client_fail(pyps_client *self, int rc, const char *call, const char *err)
{
	char buf[600];

	if (!err) {
		pyps_client_errtext(self, buf, sizeof(buf));
		err = buf;
	}
	return pyps_raise(rc, "%s: %s", call, err);
}

static uint64_t min_version_of(const struct pyps_tset *s)
{
	uint64_t v = UINT64_MAX;

	for (int i = 0; i < s->n; i++)
		if (s->t[i].version < v)
			v = s->t[i].version;
	return s->n ? v : 0;
}

/* push(tensors, clock=None, end_clock=True, asynchronous=False) */
static PyObject *client_push(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tensors", "clock", "end_clock", "asynchronous", NULL };
	PyObject *map, *clk = NULL;
	int end_clock = 1, async = 0, rc = 0;
	uint64_t clock;
	int64_t id;
	struct pyps_tset s;
	char err[600] = "";

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Opp:push", kwlist, &map, &clk, &end_clock,
					 &async) || pyps_client_enter(self) < 0)
		return NULL;
	if (get_u64(clk, ps_client_clock(self->c), &clock) < 0 ||
	    pyps_tset_get(&s, map, ps_client_config(self->c), 0, "push") < 0)
		goto err_leave;
	Py_BEGIN_ALLOW_THREADS
	id = ps_client_push(self->c, clock, s.t, s.n, end_clock ? PS_PUSH_END_CLOCK : 0);
	if (id > 0 && !async)
		rc = ps_client_wait(self->c, id);
	if (id < 0 || rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (id < 0) {
		pyps_tset_free(&s);
		pyps_client_fail(self, (int)id, "push", err);
		goto err_leave;
	}
	if (async) /* the handle takes the buffers and this use of the client */
		return pyps_handle_new(self, "push", &id, 1, s.v, s.n, s.t, 0, NULL);
	pyps_tset_free(&s);
	pyps_client_leave(self);
	if (rc < 0)
		return pyps_client_fail(self, rc, "push", err);
	Py_RETURN_NONE;
err_leave:
	pyps_client_leave(self);
	return NULL;
}

/* pull(tensors, min_version=None, asynchronous=False) -> lowest version */
static PyObject *client_pull(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "tensors", "min_version", "asynchronous", NULL };
	PyObject *map, *mv = NULL;
	int async = 0, rc = 0;
	uint64_t minv;
	int64_t id;
	struct pyps_tset s;
	char err[600] = "";

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Op:pull", kwlist, &map, &mv, &async) ||
	    pyps_client_enter(self) < 0)
		return NULL;
	/* a worker in sync mode waits for its own clock by default; a monitor or
	 * a reader, which have none, read what the shards hold now */
	if (get_u64(mv, ps_config_sync(self->config->cfg) && self->rank >= 0 ?
			ps_client_clock(self->c) : 0, &minv) < 0 || pyps_tset_get(&s, map, ps_client_config(self->c), 1, "pull") < 0)
		goto err_leave;
	Py_BEGIN_ALLOW_THREADS
	id = ps_client_pull(self->c, minv, s.t, s.n);
	if (id > 0 && !async)
		rc = ps_client_wait(self->c, id);
	if (id < 0 || rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (id < 0) {
		pyps_tset_free(&s);
		pyps_client_fail(self, (int)id, "pull", err);
		goto err_leave;
	}
	if (async)
		return pyps_handle_new(self, "pull", &id, 1, s.v, s.n, s.t, s.n, NULL);
	uint64_t version = min_version_of(&s);
	pyps_tset_free(&s);
	pyps_client_leave(self);
	if (rc < 0)
		return pyps_client_fail(self, rc, "pull", err);
	return PyLong_FromUnsignedLongLong(version);
err_leave:
	pyps_client_leave(self);
	return NULL;
}

/* Whether two buffers share memory. */
static int overlap(const Py_buffer *a, const Py_buffer *b)
{
	const char *pa = a->buf, *pb = b->buf;

	return pa < pb + b->len && pb < pa + a->len;
}

/* pushpull(grads, out, clock=None, end_clock=True, min_version=None,
 *          after_clock=False, asynchronous=False) -> lowest version */
static PyObject *client_pushpull(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "grads", "out", "clock", "end_clock", "min_version",
				  "after_clock", "asynchronous", NULL };
	PyObject *gmap, *omap, *clk = NULL, *mv = NULL;
	int end_clock = 1, after = 0, async = 0, rc = 0, rc2 = 0;
	uint64_t clock, minv;
	int64_t ids[2];
	struct pyps_tset g, o;
	char err[600] = "";
	unsigned flags;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OpOpp:pushpull", kwlist, &gmap, &omap, &clk,
					 &end_clock, &mv, &after, &async) ||
	    pyps_client_enter(self) < 0)
		return NULL;
	if (get_u64(clk, ps_client_clock(self->c), &clock) < 0)
		goto err_leave;
	if (get_u64(mv, !ps_config_sync(self->config->cfg) ? 0 :
			(end_clock || after) ? clock + 1 : clock, &minv) < 0)
		goto err_leave;
	if (pyps_tset_get(&g, gmap, ps_client_config(self->c), 0, "pushpull grads") < 0)
		goto err_leave;
	if (pyps_tset_get(&o, omap, ps_client_config(self->c), 1, "pushpull out") < 0)
		goto err_free_g;
	for (int i = 0; i < g.n; i++)
		for (int j = 0; j < o.n; j++)
			if (overlap(&g.v[i], &o.v[j])) {
				pyps_raise(-EINVAL, "pushpull: grads '%s' and out '%s' share memory "
					   "(the pull writes while the push reads): use separate "
					   "arrays", g.t[i].name, o.t[j].name);
				goto err_free_o;
			}
	flags = (end_clock ? PS_PUSH_END_CLOCK : 0) | (after ? PS_PULL_AFTER_CLOCK : 0);
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_pushpull(self->c, clock, g.t, g.n, flags, minv, o.t, o.n, ids);
	if (rc == 0 && !async) {
		/* the pull is answered after the push is applied: waiting for
		 * it first saves a wake-up (as ps-bench does) */
		rc2 = ps_client_wait(self->c, ids[1]);
		rc = ps_client_wait(self->c, ids[0]);
		if (!rc)
			rc = rc2;
	}
	if (rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (async && rc == 0) {
		/* one handle: grads' then out's buffers, versions from out */
		Py_buffer *v = PyMem_Realloc(g.v, sizeof(*v) * (size_t)(g.n + o.n));
		if (!v) {
			/* the requests are in flight: wait them out before freeing */
			Py_BEGIN_ALLOW_THREADS
			ps_client_wait(self->c, ids[0]);
			ps_client_wait(self->c, ids[1]);
			Py_END_ALLOW_THREADS
			PyErr_NoMemory();
			goto err_free_o;
		}
		g.v = v;
		memcpy(g.v + g.n, o.v, sizeof(*v) * (size_t)o.n);
		PyMem_Free(o.v);
		/* both tensor arrays stay where libps was given them until the
		 * wait (ps_client.h): the push's goes with the handle too */
		PyObject *h = pyps_handle_new(self, "pushpull", ids, 2, g.v, g.n + o.n, o.t, o.n,
					      NULL);
		if (h)
			((pyps_handle *)h)->extra = g.t;
		else
			PyMem_Free(g.t); /* pyps_handle_new waited for both */
		return h;
	}
	uint64_t version = min_version_of(&o);
	pyps_tset_free(&o);
	pyps_tset_free(&g);
	pyps_client_leave(self);
	if (rc < 0)
		return pyps_client_fail(self, rc, "pushpull", err);
	return PyLong_FromUnsignedLongLong(version);
err_free_o:
	pyps_tset_free(&o);
err_free_g:
	pyps_tset_free(&g);
err_leave:
	pyps_client_leave(self);
	return NULL;
}

/* ---- rows ---- */

static int find_table(const struct ps_config *cfg, const char *name)
{
	for (int i = 0; i < ps_config_ntables(cfg); i++)
		if (strcmp(ps_config_table_name(cfg, i), name) == 0)
			return i;
	return -1;
}

/* pull_rows / push_rows: the common part. */
static PyObject *rows_call(pyps_client *self, PyObject *args, PyObject *kw, int push)
{
	static char *pull_kw[] = { "table", "ids", "out", "min_version", "asynchronous", NULL };
	static char *push_kw[] = { "table", "ids", "grads", "clock", "fp16", "asynchronous",
				   NULL };
	const char *call = push ? "push_rows" : "pull_rows", *table;
	PyObject *idobj, *arr, *num = NULL;
	int async = 0, fp16 = 0, k, rc = 0;
	uint64_t number;
	Py_buffer *v;
	int64_t id;
	char what[200], err[600] = "";

	if (push ? !PyArg_ParseTupleAndKeywords(args, kw, "sOO|Opp:push_rows", push_kw, &table,
						&idobj, &arr, &num, &fp16, &async) :
		   !PyArg_ParseTupleAndKeywords(args, kw, "sOO|Op:pull_rows", pull_kw, &table,
						&idobj, &arr, &num, &async))
		return NULL;
	if (pyps_client_enter(self) < 0)
		return NULL;
	/* the client's config: the file's tables and the declared ones */
	k = find_table(ps_client_config(self->c), table);
	if (k < 0) {
		pyps_raise(PS_ENOTENSOR, "%s: table '%s' is not in model.embeddings of %s nor "
			   "declared (Client.tables lists them)", call, table,
			   ps_config_path(self->config->cfg));
		goto err_leave;
	}
	if (get_u64(num, push || (ps_config_sync(self->config->cfg) && self->rank >= 0) ?
			ps_client_clock(self->c) : 0, &number) < 0)
		goto err_leave;
	v = PyMem_Calloc(2, sizeof(*v));
	if (!v) {
		PyErr_NoMemory();
		goto err_leave;
	}
	if (pyps_get_ids(idobj, call, table, &v[0]) < 0)
		goto err_free;
	size_t n = (size_t)(v[0].len / 8);
	int dim = ps_config_table_dim(ps_client_config(self->c), k);
	snprintf(what, sizeof(what), "%s '%s' %s (%zu ids x dim %d)", call, table,
		 push ? "grads" : "out", n, dim);
	if (pyps_get_f32(arr, what, (int64_t)n * dim, !push, &v[1]) < 0)
		goto err_release_ids;
	Py_BEGIN_ALLOW_THREADS
	if (push)
		id = ps_client_push_rows_async(self->c, table, number, v[0].buf, n, v[1].buf,
					       fp16 ? PS_PUSH_ROWS_FP16 : 0);
	else
		id = ps_client_pull_rows_async(self->c, table, number, v[0].buf, n, v[1].buf);
	if (id > 0 && !async)
		rc = ps_client_wait(self->c, id);
	if (id < 0 || rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (id < 0) {
		pyps_client_fail(self, (int)id, call, err);
		goto err_release_arr;
	}
	if (async) {
		Py_INCREF(arr);
		return pyps_handle_new(self, call, &id, 1, v, 2, NULL, 0, push ? NULL : arr);
	}
	PyBuffer_Release(&v[1]);
	PyBuffer_Release(&v[0]);
	PyMem_Free(v);
	pyps_client_leave(self);
	if (rc < 0)
		return pyps_client_fail(self, rc, call, err);
	if (push)
		Py_RETURN_NONE;
	Py_INCREF(arr);
	return arr;
err_release_arr:
	PyBuffer_Release(&v[1]);
err_release_ids:
	PyBuffer_Release(&v[0]);
err_free:
	PyMem_Free(v);
err_leave:
	pyps_client_leave(self);
	return NULL;
}

static PyObject *client_pull_rows(pyps_client *self, PyObject *args, PyObject *kw)
{
	return rows_call(self, args, kw, 0);
}

static PyObject *client_push_rows(pyps_client *self, PyObject *args, PyObject *kw)
{
	return rows_call(self, args, kw, 1);
}

/* ---- stats, checkpoints, state ---- */

static int shard_arg(pyps_client *self, int shard)
{
	int n = ps_config_nshards(self->config->cfg);

	if (shard >= 0 && shard < n)
		return 0;
	pyps_raise(-EINVAL, "shard %d: the config has shards 0..%d", shard, n - 1);
	return -1;
}

/* stats(shard) / checkpoint(shard, write=True) -> dict */
static PyObject *stats_call(pyps_client *self, int shard, int ckpt, int write)
{
	struct ps_shard_stats *st;
	char err[600] = "";
	PyObject *d = NULL;
	int rc;

	if (pyps_client_enter(self) < 0)
		return NULL;
	if (shard_arg(self, shard) < 0)
		goto err_leave;
	st = PyMem_Calloc(1, sizeof(*st));
	if (!st) {
		PyErr_NoMemory();
		goto err_leave;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ckpt ? ps_client_checkpoint(self->c, shard, write, st) :
		    ps_client_stats(self->c, shard, st);
	if (rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	if (rc < 0)
		pyps_client_fail(self, rc, ckpt ? "checkpoint" : "stats", err);
	else
		d = pyps_stats_dict(st);
	PyMem_Free(st);
err_leave:
	pyps_client_leave(self);
	return d;
}

static PyObject *client_stats(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "shard", NULL };
	int shard;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "i:stats", kwlist, &shard))
		return NULL;
	return stats_call(self, shard, 0, 0);
}

static PyObject *client_checkpoint(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "shard", "write", NULL };
	int shard, write = 1;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "i|p:checkpoint", kwlist, &shard, &write))
		return NULL;
	return stats_call(self, shard, 1, write);
}

static PyObject *client_shard_error(pyps_client *self, PyObject *arg)
{
	char buf[600];
	const char *why;
	long shard = PyLong_AsLong(arg);

	if ((shard == -1 && PyErr_Occurred()) || pyps_client_enter(self) < 0)
		return NULL;
	if (shard_arg(self, (int)shard) < 0) {
		pyps_client_leave(self);
		return NULL;
	}
	why = ps_client_shard_error(self->c, (int)shard, buf, sizeof(buf));
	pyps_client_leave(self);
	if (!why)
		Py_RETURN_NONE;
	return PyUnicode_FromString(why);
}

static PyObject *client_clock(pyps_client *self, PyObject *noarg)
{
	uint64_t clock;

	(void)noarg;
	if (pyps_client_enter(self) < 0)
		return NULL;
	clock = ps_client_clock(self->c);
	pyps_client_leave(self);
	return PyLong_FromUnsignedLongLong(clock);
}

/* join(): ps_client_join (a member already: nothing to do). */
static PyObject *client_join(pyps_client *self, PyObject *noarg)
{
	char err[600] = "";
	int rc;

	(void)noarg;
	if (pyps_client_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_join(self->c);
	if (rc)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	pyps_client_leave(self);
	if (rc)
		return pyps_client_fail(self, rc, "join", err);
	Py_RETURN_NONE;
}

/* leave(clock=None): ps_client_leave at clock (default: the client's). */
static PyObject *client_leave_cluster(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kws[] = { "clock", NULL };
	PyObject *clk = Py_None;
	char err[600] = "";
	uint64_t clock;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kws, &clk) ||
	    pyps_client_enter(self) < 0)
		return NULL;
	if (get_u64(clk, ps_client_clock(self->c), &clock) < 0) {
		pyps_client_leave(self);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_leave(self->c, clock);
	if (rc)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	pyps_client_leave(self);
	if (rc)
		return pyps_client_fail(self, rc, "leave", err);
	Py_RETURN_NONE;
}

/* leave_begin() -> int: ps_client_leave_begin, the last clock to train. */
static PyObject *client_leave_begin(pyps_client *self, PyObject *noarg)
{
	char err[600] = "";
	uint64_t last = 0;
	int rc;

	(void)noarg;
	if (pyps_client_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_leave_begin(self->c, &last);
	if (rc)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	pyps_client_leave(self);
	if (rc)
		return pyps_client_fail(self, rc, "leave_begin", err);
	return PyLong_FromUnsignedLongLong(last);
}

/* members() -> dict: ps_client_members. */
static PyObject *client_members(pyps_client *self, PyObject *noarg)
{
	struct ps_members_info mi;
	int rc;

	(void)noarg;
	if (pyps_client_enter(self) < 0)
		return NULL;
	rc = ps_client_members(self->c, &mi);
	pyps_client_leave(self);
	if (rc)
		return pyps_client_fail(self, rc, "members", "not a worker");
	return Py_BuildValue("{s:K,s:K,s:K,s:i,s:i}", "clock", (unsigned long long)mi.clock,
			     "epoch", (unsigned long long)mi.epoch, "before",
			     (unsigned long long)mi.before, "count", mi.count, "index", mi.index);
}

static PyObject *client_get_tensors(pyps_client *self, void *closure)
{
	PyObject *d;

	(void)closure;
	if (pyps_client_enter(self) < 0)
		return NULL;
	d = pyps_tensors_dict(ps_client_config(self->c));
	pyps_client_leave(self);
	return d;
}

static PyObject *client_get_rank(pyps_client *self, void *closure)
{
	(void)closure;
	return PyLong_FromLong(self->rank);
}

static PyObject *client_get_config(pyps_client *self, void *closure)
{
	(void)closure;
	if (!self->config)
		Py_RETURN_NONE;
	Py_INCREF((PyObject *)self->config);
	return (PyObject *)self->config;
}

static PyObject *client_get_closed(pyps_client *self, void *closure)
{
	(void)closure;
	return PyBool_FromLong(self->closed || !self->c);
}

static PyMethodDef client_methods[] = {
	{ "push", (PyCFunction)(void (*)(void))client_push, METH_VARARGS | METH_KEYWORDS,
	  "push(tensors, clock=None, end_clock=True, asynchronous=False)" },
	{ "pull", (PyCFunction)(void (*)(void))client_pull, METH_VARARGS | METH_KEYWORDS,
	  "pull(tensors, min_version=None, asynchronous=False) -> lowest version" },
	{ "pushpull", (PyCFunction)(void (*)(void))client_pushpull, METH_VARARGS | METH_KEYWORDS,
	  "pushpull(grads, out, clock=None, end_clock=True, min_version=None, after_clock=False, "
	  "asynchronous=False) -> lowest version" },
	{ "pull_rows", (PyCFunction)(void (*)(void))client_pull_rows, METH_VARARGS | METH_KEYWORDS,
	  "pull_rows(table, ids, out, min_version=None, asynchronous=False) -> out" },
	{ "push_rows", (PyCFunction)(void (*)(void))client_push_rows, METH_VARARGS | METH_KEYWORDS,
	  "push_rows(table, ids, grads, clock=None, fp16=False, asynchronous=False)" },
	{ "stats", (PyCFunction)(void (*)(void))client_stats, METH_VARARGS | METH_KEYWORDS,
	  "stats(shard) -> dict of the shard's counters" },
	{ "checkpoint", (PyCFunction)(void (*)(void))client_checkpoint,
	  METH_VARARGS | METH_KEYWORDS, "checkpoint(shard, write=True) -> dict" },
	{ "shard_error", (PyCFunction)client_shard_error, METH_O,
	  "shard_error(shard) -> None when connected, else why not" },
	{ "declare_tables", (PyCFunction)pyps_client_declare_tables, METH_VARARGS,
	  "declare_tables(tables): embedding tables at run time (use ps.Client.declare_tables)" },
	{ "declare", (PyCFunction)(void (*)(void))pyps_client_declare, METH_VARARGS | METH_KEYWORDS,
	  "declare(params, groups=None, group_of=None): the model's tensors, {name: float32 "
	  "array} in the model's order (a config without a model); the arrays get the shards' "
	  "values" },
	{ "set_lr", (PyCFunction)pyps_client_set_lr, METH_VARARGS,
	  "set_lr(group, lr): the learning rate of an optimizer group from the next push on" },
	{ "clock", (PyCFunction)client_clock, METH_NOARGS,
	  "the clock the next push belongs to (clocks finished so far)" },
	{ "join", (PyCFunction)client_join, METH_NOARGS,
	  "join(): become a member of the running cluster (nothing for a member)" },
	{ "leave", (PyCFunction)(void (*)(void))client_leave_cluster, METH_VARARGS | METH_KEYWORDS,
	  "leave(clock=None): end clock (default: the current one) and leave the membership" },
	{ "leave_begin", (PyCFunction)client_leave_begin, METH_NOARGS,
	  "leave_begin() -> clock: the last clock to train before leaving with its push "
	  "(async with a staleness: the highest clock any shard told with this worker as a "
	  "member; see docs/python.md)" },
	{ "members", (PyCFunction)client_members, METH_NOARGS,
	  "members() -> {clock, epoch, before, count, index}: the membership the last pull "
	  "told" },
	{ "close", (PyCFunction)client_close, METH_NOARGS,
	  "closes every connection (once calls and handles in flight are done)" },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef client_getset[] = {
	{ "rank", (getter)client_get_rank, NULL, "worker rank, -1 for a monitor, -2 for a reader", NULL },
	{ "config", (getter)client_get_config, NULL, "the ps.Config connected with", NULL },
	{ "closed", (getter)client_get_closed, NULL, "True once close() was called", NULL },
	{ "tables", (getter)pyps_client_get_tables, NULL, "{name: row width}: the config's "
	  "model.embeddings and the declared tables", NULL },
	{ "tensors", (getter)client_get_tensors, NULL, "{name: element count}: the config's "
	  "tensors, or the declared ones", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot client_slots[] = {
	{ Py_tp_init, client_init },
	{ Py_tp_dealloc, client_dealloc },
	{ Py_tp_methods, client_methods },
	{ Py_tp_getset, client_getset },
	{ Py_tp_doc, "Client(config, rank): connects to every shard (ps.Client is the "
		     "documented front)." },
	{ 0, NULL },
};

static PyType_Spec client_spec = {
	"ps._ps.Client", sizeof(pyps_client), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	client_slots,
};

int pyps_init_client(PyObject *m)
{
	pyps_ClientType = (PyTypeObject *)PyType_FromSpec(&client_spec);
	if (!pyps_ClientType)
		return -1;
	return PyModule_AddObjectRef(m, "Client", (PyObject *)pyps_ClientType);
}
