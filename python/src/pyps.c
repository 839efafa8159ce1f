/* pyps.c - the ps._ps module: its exception classes, the code names and
 * the Config type (an opened config file; the same file:line errors as
 * every program of the system).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "pyps.h"

PyObject *pyps_Error, *pyps_ForkError, *pyps_ArrayError;
static PyObject *config_error, *auth_error, *timeout_error, *refused_error, *notfinite_error,
	*unknown_error, *closed_error, *state_error, *conn_error, *proto_error, *toobig_error;

static const char *const ps_names[] = {
	"PS_ECONFIG", "PS_EPROTO", "PS_EVERSION", "PS_EMAP", "PS_ETOOBIG", "PS_ENOTSUP",
	"PS_ECLOSED", "PS_ETIMEDOUT", "PS_EREFUSED", "PS_ENOTENSOR", "PS_ESHAPE", "PS_ESTATE",
	"PS_ECLOCK", "PS_EDUP", "PS_ENOFINITE", "PS_EAUTH", "PS_ERESOLVE", "PS_ERESHARD",
};
_Static_assert(sizeof(ps_names) / sizeof(ps_names[0]) == PS_ELAST - PS_EBASE - 1,
	       "ps_names must name every PS_E* code of ps_err.h");

const char *pyps_code_name(int code)
{
	const char *n;

	if (code > PS_EBASE && code < PS_ELAST)
		return ps_names[code - PS_EBASE - 1];
	n = code < 0 ? strerrorname_np(-code) : NULL;
	return n ? n : "PS_EUNKNOWN";
}

/* The class a code raises. */
static PyObject *class_of(int code)
{
	switch (code) {
	case PS_ECONFIG: return config_error;
	case PS_EAUTH: return auth_error;
	case PS_ETIMEDOUT: case -ETIMEDOUT: return timeout_error;
	case PS_EREFUSED: case PS_EVERSION: case PS_EMAP: return refused_error;
	case PS_ENOFINITE: return notfinite_error;
	case PS_ENOTENSOR: return unknown_error;
	case PS_ESHAPE: return pyps_ArrayError;
	case PS_ECLOSED: return closed_error;
	case PS_ESTATE: return state_error;
	case PS_EPROTO: return proto_error;
	case PS_ETOOBIG: return toobig_error;
	case PS_ERESOLVE: case -ECONNREFUSED: case -ECONNRESET: case -EPIPE: case -EHOSTUNREACH:
	case -ENETUNREACH: case -ECONNABORTED: case -EADDRNOTAVAIL:
		return conn_error;
	default: return pyps_Error;
	}
}

/* Raises cls (a subclass of ps.Error) with message and code. */
static PyObject *raise_class(PyObject *cls, int code, const char *msg)
{
	PyObject *e = PyObject_CallFunction(cls, "s", msg), *v;

	if (!e)
		return NULL;
	v = PyLong_FromLong(code);
	if (!v || PyObject_SetAttrString(e, "code", v) < 0)
		goto err_drop;
	Py_DECREF(v);
	v = PyUnicode_FromString(pyps_code_name(code));
	if (!v || PyObject_SetAttrString(e, "code_name", v) < 0)
		goto err_drop;
	Py_DECREF(v);
	PyErr_SetObject(cls, e);
	Py_DECREF(e);
	return NULL;
err_drop:
	Py_XDECREF(v);
	Py_DECREF(e);
	return NULL;
}

PyObject *pyps_raise(int code, const char *fmt, ...)
{
	char what[1024], msg[1100];
	PyObject *cls = class_of(code);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	snprintf(msg, sizeof(msg), "%s: %s", pyps_code_name(code), what);
	if (code == PS_ESTATE && strstr(what, "fork"))
		cls = pyps_ForkError;
	return raise_class(cls, code, msg);
}

/* ---- Config ---- */

PyTypeObject *pyps_ConfigType;

static int config_init(pyps_config *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "path", NULL };
	PyObject *pathobj;
	const char *path;
	char err[1024];
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&:Config", kwlist, PyUnicode_FSConverter,
					 &pathobj))
		return -1;
	path = PyBytes_AsString(pathobj);
	if (self->cfg) {
		ps_config_close(self->cfg);
		self->cfg = NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	rc = ps_config_open(&self->cfg, path, err, sizeof(err));
	Py_END_ALLOW_THREADS
	Py_DECREF(pathobj);
	if (rc) {
		pyps_raise(rc, "%s", err);
		return -1;
	}
	return 0;
}

static void config_dealloc(pyps_config *self)
{
	PyTypeObject *tp = Py_TYPE((PyObject *)self);
	freefunc tp_free = PyType_GetSlot(tp, Py_tp_free);

	if (self->cfg)
		ps_config_close(self->cfg);
	tp_free(self);
	Py_DECREF(tp);
}

static int config_ok(pyps_config *self)
{
	if (self->cfg)
		return 1;
	pyps_raise(PS_ESTATE, "the Config was not opened (Config(path))");
	return 0;
}

/* {name: element count} of cfg's tensors, in order (Config.tensors, and
 * Client.tensors with the declared ones). */
PyObject *pyps_tensors_dict(const struct ps_config *cfg)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	for (int i = 0; i < ps_config_ntensors(cfg); i++) {
		PyObject *v = PyLong_FromLongLong(ps_config_tensor_count(cfg, i));
		if (!v || PyDict_SetItemString(d, ps_config_tensor_name(cfg, i), v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

/* tensors: {name: element count} in config order */
static PyObject *config_tensors(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? pyps_tensors_dict(self->cfg) : NULL;
}

static PyObject *config_declared(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyBool_FromLong(ps_config_declared(self->cfg)) : NULL;
}

/* tables: {name: row width} */
static PyObject *config_tables(pyps_config *self, void *closure)
{
	PyObject *d;

	(void)closure;
	if (!config_ok(self) || !(d = PyDict_New()))
		return NULL;
	for (int i = 0; i < ps_config_ntables(self->cfg); i++) {
		PyObject *v = PyLong_FromLong(ps_config_table_dim(self->cfg, i));
		if (!v || PyDict_SetItemString(d, ps_config_table_name(self->cfg, i), v) < 0) {
			Py_XDECREF(v);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(v);
	}
	return d;
}

static PyObject *config_nshards(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyLong_FromLong(ps_config_nshards(self->cfg)) : NULL;
}

static PyObject *config_nworkers(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyLong_FromLong(ps_config_nworkers(self->cfg)) : NULL;
}

static PyObject *config_sync(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyBool_FromLong(ps_config_sync(self->cfg)) : NULL;
}

static PyObject *config_staleness(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyLong_FromLong(ps_config_staleness(self->cfg)) : NULL;
}

static PyObject *config_connect_timeout(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ?
		PyFloat_FromDouble(ps_config_connect_timeout_ms(self->cfg) / 1000.0) : NULL;
}

static PyObject *config_path(pyps_config *self, void *closure)
{
	(void)closure;
	return config_ok(self) ? PyUnicode_DecodeFSDefault(ps_config_path(self->cfg)) : NULL;
}

static PyGetSetDef config_getset[] = {
	{ "tensors", (getter)config_tensors, NULL, "{name: element count} in config order", NULL },
	{ "tables", (getter)config_tables, NULL, "{name: row width} of model.embeddings", NULL },
	{ "declared", (getter)config_declared, NULL, "True when the config names no model: "
	  "workers declare its tensors (Client.declare)", NULL },
	{ "nshards", (getter)config_nshards, NULL, "number of shards", NULL },
	{ "nworkers", (getter)config_nworkers, NULL, "number of workers (cluster.workers)", NULL },
	{ "sync", (getter)config_sync, NULL, "True for consistency: sync", NULL },
	{ "staleness", (getter)config_staleness, NULL, "async staleness bound", NULL },
	{ "connect_timeout", (getter)config_connect_timeout, NULL,
	  "limits.connect_timeout_ms in seconds: how long to wait for the shards to come up",
	  NULL },
	{ "path", (getter)config_path, NULL, "the file it was loaded from", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot config_slots[] = {
	{ Py_tp_init, config_init },
	{ Py_tp_dealloc, config_dealloc },
	{ Py_tp_getset, config_getset },
	{ Py_tp_doc, "Config(path): a cluster config file, loaded and validated." },
	{ 0, NULL },
};

static PyType_Spec config_spec = {
	"ps._ps.Config", sizeof(pyps_config), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	config_slots,
};

/* ---- module ---- */

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
	long code = PyLong_AsLong(arg);

	(void)m;
	if (code == -1 && PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ps_strerror((int)code));
}

static PyObject *mod_version(PyObject *m, PyObject *noarg)
{
	(void)m;
	(void)noarg;
	return PyUnicode_FromString(ps_version());
}

static PyMethodDef mod_methods[] = {
	{ "strerror", mod_strerror, METH_O, "strerror(code): libps's text for a code" },
	{ "version", mod_version, METH_NOARGS, "the version of the libps.so in use" },
	{ "unique_ids", pyps_unique_ids, METH_VARARGS,
	  "unique_ids(ids, u, inv) -> k: the distinct ids into u[:k] (first occurrence "
	  "order), ids[i] == u[inv[i]]" },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef mod_def = {
	PyModuleDef_HEAD_INIT, "ps._ps", "libps's client API (use the ps package)", -1,
	mod_methods, NULL, NULL, NULL, NULL,
};

/* Adds class name (bases: base and, when not NULL, builtin) to m. */
static PyObject *add_error(PyObject *m, const char *name, PyObject *base, PyObject *builtin,
			   const char *doc)
{
	char full[64];
	PyObject *bases, *cls;

	snprintf(full, sizeof(full), "ps.%s", name);
	bases = builtin ? PyTuple_Pack(2, base, builtin) : PyTuple_Pack(1, base);
	if (!bases)
		return NULL;
	cls = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	Py_DECREF(bases);
	if (!cls || PyModule_AddObjectRef(m, name, cls) < 0)
		return NULL;
	return cls; /* the module and this global hold it */
}

PyMODINIT_FUNC PyInit__ps(void)
{
	PyObject *m = PyModule_Create(&mod_def);

	if (!m)
		return NULL;
	pyps_Error = PyErr_NewExceptionWithDoc("ps.Error",
		"A libps failure: .code (a negative PS_E* or -errno), .code_name.", NULL, NULL);
	if (!pyps_Error || PyModule_AddObjectRef(m, "Error", pyps_Error) < 0)
		goto err;
	if (!(config_error = add_error(m, "ConfigError", pyps_Error, NULL,
				       "The config file is invalid (the message names file:line).")) ||
	    !(auth_error = add_error(m, "AuthError", pyps_Error, NULL,
				     "Authentication failed: a wrong or missing secret.")) ||
	    !(timeout_error = add_error(m, "TimeoutError", pyps_Error, PyExc_TimeoutError,
					"A request or a wait ran past its time.")) ||
	    !(refused_error = add_error(m, "RefusedError", pyps_Error, NULL,
					"A shard refused the handshake (both sides' values named).")) ||
	    !(notfinite_error = add_error(m, "NotFiniteError", pyps_Error, PyExc_ValueError,
					  "A pushed value was NaN or infinite.")) ||
	    !(unknown_error = add_error(m, "UnknownNameError", pyps_Error, PyExc_LookupError,
					"No tensor or table of that name in the config.")) ||
	    !(pyps_ArrayError = add_error(m, "ArrayError", pyps_Error, PyExc_ValueError,
					  "An array of the wrong dtype, size, layout or device.")) ||
	    !(closed_error = add_error(m, "ClosedError", pyps_Error, PyExc_ConnectionError,
				       "A shard's connection closed.")) ||
	    !(conn_error = add_error(m, "ConnectionError", pyps_Error, PyExc_ConnectionError,
				     "A shard could not be reached.")) ||
	    !(state_error = add_error(m, "StateError", pyps_Error, NULL,
				      "The call is not valid now (a closed client, ...).")) ||
	    !(pyps_ForkError = add_error(m, "ForkError", state_error, NULL,
					 "A client used in a process forked from the one that "
					 "connected it.")) ||
	    !(proto_error = add_error(m, "ProtocolError", pyps_Error, NULL,
				      "A peer broke the wire protocol.")) ||
	    !(toobig_error = add_error(m, "TooBigError", pyps_Error, PyExc_ValueError,
				       "A request exceeds a configured limit.")))
		goto err;
	pyps_ConfigType = (PyTypeObject *)PyType_FromSpec(&config_spec);
	if (!pyps_ConfigType || PyModule_AddObjectRef(m, "Config", (PyObject *)pyps_ConfigType) < 0)
		goto err;
	if (pyps_init_client(m) < 0 || pyps_init_handle(m) < 0)
		goto err;
	for (int code = PS_EBASE + 1; code < PS_ELAST; code++)
		if (PyModule_AddIntConstant(m, pyps_code_name(code), code) < 0)
			goto err;
	if (PyModule_AddIntConstant(m, "PUSH_ROWS_FP16", PS_PUSH_ROWS_FP16) < 0)
		goto err;
	return m;
err:
	Py_DECREF(m);
	return NULL;
}
