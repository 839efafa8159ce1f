/* declare.c - ps.Client's run-time declarations: the model's tensors with
 * their optimizer groups (declare), embedding tables (declare_tables and
 * the tables attribute), and each group's learning rate (set_lr). The
 * dense and row calls are client.c's.
 */
#include <string.h>
#include "pyps.h"

/* The optimizer groups of declare(): groups, a sequence of tuples (kind,
 * lr, momentum, dampening, nesterov, beta1, beta2, eps, weight_decay,
 * lr_decay, initial_accumulator, average) that ps.Client.declare made from
 * the user's dicts, into og (*ng of them, at most 64); group_of, one int
 * per parameter (n), into gof. -1 with an exception set. The kind strings
 * point into groups, which the caller keeps. */
static int parse_groups(PyObject *groups, PyObject *group_of, Py_ssize_t n,
			struct ps_optim_group *og, int *ng, int *gof)
{
	Py_ssize_t k;

	if (!PySequence_Check(groups) || (k = PySequence_Size(groups)) < 1 || k > 64) {
		PyErr_Clear();
		pyps_raise(-EINVAL, "declare: groups must be a list of 1..64 optimizer groups");
		return -1;
	}
	for (Py_ssize_t g = 0; g < k; g++) {
		PyObject *t = PySequence_GetItem(groups, g);
		struct ps_optim_group *o = &og[g];
		int ok;

		if (!t)
			return -1;
		memset(o, 0, sizeof(*o));
		ok = PyTuple_Check(t) &&
		     PyArg_ParseTuple(t, "sfffpffffffp", &o->kind, &o->lr, &o->momentum,
				      &o->dampening, &o->nesterov, &o->beta1, &o->beta2, &o->eps,
				      &o->weight_decay, &o->lr_decay, &o->initial_accumulator,
				      &o->average);
		Py_DECREF(t);
		if (!ok) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "declare: optimizer group %zd is not a settings tuple "
				   "(use ps.Client.declare)", g);
			return -1;
		}
	}
	*ng = (int)k;
	if (group_of == Py_None) {
		if (k != 1) {
			pyps_raise(-EINVAL, "declare: %zd optimizer groups need group_of, one group "
				   "index per parameter", k);
			return -1;
		}
		for (Py_ssize_t i = 0; i < n; i++)
			gof[i] = 0;
		return 0;
	}
	if (!PySequence_Check(group_of) || PySequence_Size(group_of) != n) {
		PyErr_Clear();
		pyps_raise(-EINVAL, "declare: group_of must hold one group index per parameter (%zd)",
			   n);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *x = PySequence_GetItem(group_of, i);
		long v = x ? PyLong_AsLong(x) : -1;

		Py_XDECREF(x);
		if (v == -1 && PyErr_Occurred()) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "declare: group_of[%zd] is not an int", i);
			return -1;
		}
		gof[i] = v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : (int)v;
	}
	return 0;
}

/* declare(params, groups=None, group_of=None): params maps each
 * parameter's name to its array, in the model's order (a dict, or a
 * sequence of (name, array) pairs); the shapes are the arrays' own. The
 * arrays are read (rank 0's initial values) and then overwritten with the
 * shards' values. groups: optimizer groups as parse_groups takes them. */
PyObject *pyps_client_declare(pyps_client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "params", "groups", "group_of", NULL };
	PyObject *params, *groups = Py_None, *group_of = Py_None;
	PyObject *items = NULL, *seq = NULL;
	Py_buffer *v = NULL;
	struct ps_param *p = NULL;
	struct ps_optim_group og[64];
	int *gof = NULL, ng = 0;
	int64_t (*dims)[8] = NULL;
	Py_ssize_t n = 0, got = 0;
	char err[600] = "";
	int rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:declare", kwlist, &params, &groups,
					 &group_of))
		return NULL;
	if (pyps_client_enter(self) < 0)
		return NULL;
	items = PyDict_Check(params) ? PyDict_Items(params) :
		PyMapping_Check(params) && !PySequence_Check(params) ? PyMapping_Items(params) :
		(Py_INCREF(params), params);
	if (!items)
		goto err_leave;
	seq = PySequence_Check(items) ? PySequence_List(items) : NULL;
	if (!seq) {
		PyErr_Clear();
		pyps_raise(-EINVAL, "declare: a dict {name: array} or (name, array) pairs expected");
		goto err_leave;
	}
	n = PyList_Size(seq);
	if (n < 1 || n > 8192) {
		pyps_raise(PS_ETOOBIG, "declare: %zd parameters given, 1..8192 expected", n);
		goto err_leave;
	}
	v = PyMem_Calloc((size_t)n, sizeof(*v));
	p = PyMem_Calloc((size_t)n, sizeof(*p));
	dims = PyMem_Calloc((size_t)n, sizeof(*dims));
	gof = PyMem_Calloc((size_t)n, sizeof(*gof));
	if (!v || !p || !dims || !gof) {
		PyErr_NoMemory();
		goto err_release;
	}
	if (groups != Py_None && parse_groups(groups, group_of, n, og, &ng, gof) < 0)
		goto err_release;
	for (; got < n; got++) {
		PyObject *it = PyList_GetItem(seq, got), *name, *arr;
		char what[100];

		if (!PyTuple_Check(it) || PyTuple_Size(it) != 2) {
			pyps_raise(-EINVAL, "declare: item %zd is not a (name, array) pair", got);
			goto err_release;
		}
		name = PyTuple_GetItem(it, 0);
		arr = PyTuple_GetItem(it, 1);
		p[got].name = PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, NULL) : NULL;
		if (!p[got].name) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "declare: the name of item %zd is not a str", got);
			goto err_release;
		}
		snprintf(what, sizeof(what), "parameter '%.64s'", p[got].name);
		if (pyps_get_f32(arr, what, -1, 1, &v[got]) < 0)
			goto err_release;
		if (v[got].ndim > 8) {
			pyps_raise(PS_ETOOBIG, "declare: %s has %d dims, at most 8", what, v[got].ndim);
			got++;
			goto err_release;
		}
		p[got].ndims = v[got].ndim;
		for (int j = 0; j < v[got].ndim; j++)
			dims[got][j] = v[got].shape ? (int64_t)v[got].shape[j] : 0;
		if (v[got].ndim == 1 && !v[got].shape)
			dims[got][0] = v[got].len / 4;
		p[got].dims = dims[got];
		p[got].data = v[got].buf;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ng ? ps_client_declare_groups(self->c, p, (int)n, og, ng, gof)
		: ps_client_declare(self->c, p, (int)n);
	if (rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
err_release:
	for (Py_ssize_t i = 0; i < got; i++)
		PyBuffer_Release(&v[i]);
	PyMem_Free(v);
	PyMem_Free(p);
	PyMem_Free(dims);
	PyMem_Free(gof);
	Py_XDECREF(seq);
	Py_XDECREF(items);
	pyps_client_leave(self);
	if (PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyps_client_fail(self, rc, "declare", err);
	Py_RETURN_NONE;
err_leave:
	Py_XDECREF(seq);
	Py_XDECREF(items);
	pyps_client_leave(self);
	return NULL;
}

/* declare_tables(tables): embedding tables declared at run time, a list
 * of settings tuples (name, dim, init, init_value, optimizer, lr, eps,
 * beta1, beta2, initial_accumulator, l1, l2, ftrl_beta, admission, ttl_s,
 * max_rows) that ps.Client.declare_tables made from the caller's dicts
 * (None / 0: the key's default). */
PyObject *pyps_client_declare_tables(pyps_client *self, PyObject *args)
{
	PyObject *list, *seq = NULL;
	struct ps_table_decl *t = NULL;
	Py_ssize_t n;
	char err[600] = "";
	int rc = 0;

	if (!PyArg_ParseTuple(args, "O:declare_tables", &list))
		return NULL;
	seq = PySequence_Check(list) ? PySequence_List(list) : NULL;
	if (!seq) {
		PyErr_Clear();
		return pyps_raise(-EINVAL, "declare_tables: a list of tables expected");
	}
	n = PyList_Size(seq);
	if (n < 1 || n > 64) {
		Py_DECREF(seq);
		return pyps_raise(PS_ETOOBIG, "declare_tables: %zd tables given, 1..64 expected", n);
	}
	t = PyMem_Calloc((size_t)n, sizeof(*t));
	if (!t) {
		Py_DECREF(seq);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		struct ps_table_decl *d = &t[i];
		unsigned long long ttl, max_rows;

		if (!PyTuple_Check(PyList_GetItem(seq, i)) ||
		    !PyArg_ParseTuple(PyList_GetItem(seq, i), "sIzfzffffffffIKK", &d->name,
				      &d->dim, &d->init, &d->init_value, &d->optimizer, &d->lr,
				      &d->eps, &d->beta1, &d->beta2, &d->initial_accumulator,
				      &d->l1, &d->l2, &d->ftrl_beta, &d->admission, &ttl,
				      &max_rows)) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "declare_tables: table %zd is not a settings tuple (use "
				   "ps.Client.declare_tables)", i);
			goto out;
		}
		d->ttl_s = ttl;
		d->max_rows = max_rows;
	}
	if (pyps_client_enter(self) < 0)
		goto out;
	Py_BEGIN_ALLOW_THREADS
	rc = ps_client_declare_tables(self->c, t, (int)n);
	if (rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	Py_END_ALLOW_THREADS
	pyps_client_leave(self);
out:
	/* the names point into seq's tuples: released after the call */
	PyMem_Free(t);
	Py_DECREF(seq);
	if (PyErr_Occurred())
		return NULL;
	if (rc < 0)
		return pyps_client_fail(self, rc, "declare_tables", err);
	Py_RETURN_NONE;
}

PyObject *pyps_client_get_tables(pyps_client *self, void *closure)
{
	const struct ps_config *cfg;
	PyObject *d;

	(void)closure;
	if (pyps_client_enter(self) < 0)
		return NULL;
	cfg = ps_client_config(self->c);
	d = PyDict_New();
	for (int i = 0; d && i < ps_config_ntables(cfg); i++) {
		PyObject *v = PyLong_FromLong(ps_config_table_dim(cfg, i));
		if (!v || PyDict_SetItemString(d, ps_config_table_name(cfg, i), v) < 0) {
			Py_XDECREF(v);
			Py_CLEAR(d);
			break;
		}
		Py_DECREF(v);
	}
	pyps_client_leave(self);
	return d;
}

/* set_lr(group, lr): the learning rate of an optimizer group from this
 * client's next pushes on. Takes a lock only, so it keeps the GIL. */
PyObject *pyps_client_set_lr(pyps_client *self, PyObject *args)
{
	int group, rc;
	float lr;
	char err[300] = "";

	if (!PyArg_ParseTuple(args, "if:set_lr", &group, &lr))
		return NULL;
	if (pyps_client_enter(self) < 0)
		return NULL;
	rc = ps_client_set_lr(self->c, group, lr);
	if (rc < 0)
		pyps_client_errtext(self, err, sizeof(err));
	pyps_client_leave(self);
	if (rc < 0)
		return pyps_client_fail(self, rc, "set_lr", err);
	Py_RETURN_NONE;
}
