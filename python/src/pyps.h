/* pyps.h - what the files of the ps._ps extension share.
 *
 * The extension is written against CPython's stable ABI (Py_LIMITED_API
 * 3.11: the buffer protocol is part of it from 3.11), so one build serves
 * every CPython from 3.11 on, and it links only libps.so: no numpy C API,
 * no framework. Arrays come in through the buffer protocol, without copies.
 *
 *   pyps.c     module init, the exception classes, the Config type
 *   client.c   the Client type: connect, push, pull, rows, close, fork guard
 *   declare.c  the Client's run-time declarations: tensors, groups, tables
 *   arrays.c   arrays in: buffers checked for dtype, layout, size, device
 *   handle.c   the Handle of an asynchronous call: wait, done, timeout
 *   stats.c    struct ps_shard_stats as a dict
 *   unique.c   unique_ids: a batch's distinct ids for the embedding modules
 *
 * Threads: every call that can wait runs with the GIL released; libps's
 * own threads never call into Python (no callbacks are registered).
 */
#ifndef PYPS_H
#define PYPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <sys/types.h>
#include "ps_client.h"

/* The exception classes (pyps.c): ps.Error and its subclasses. */
extern PyObject *pyps_Error, *pyps_ForkError, *pyps_ArrayError;

/* Raises the class for code (a negative PS_E* or -errno) with the message
 * "PS_EXXX: what" and e.code = code; returns NULL. */
PyObject *pyps_raise(int code, const char *fmt, ...);
/* The name of code: "PS_EAUTH", "ECONNREFUSED", ... */
const char *pyps_code_name(int code);

/* ps.Config: an opened config file. */
typedef struct {
	PyObject_HEAD
	struct ps_config *cfg;
} pyps_config;
extern PyTypeObject *pyps_ConfigType;

/* ps.Client: one connection to every shard. busy counts the calls and
 * handles using c right now; close() frees c once busy reaches 0, so a
 * thread inside a call never sees c freed under it. */
typedef struct {
	PyObject_HEAD
	struct ps_client *c;
	pyps_config *config;
	int rank;
	pid_t pid;     /* the process that connected: in a forked child c is unusable */
	int closed;
	long busy;
} pyps_client;
extern PyTypeObject *pyps_ClientType;

/* Checks c may be used (not closed, not in a forked child) and counts one
 * user; 0 or -1 with an exception set. */
int pyps_client_enter(pyps_client *self);
/* Drops that user; frees c when the client was closed meanwhile. */
void pyps_client_leave(pyps_client *self);
/* The client's last error text, copied into buf (any thread). */
void pyps_client_errtext(pyps_client *self, char *buf, size_t len);
/* Raises for a libps failure rc (< 0) of call; err NULL: the client's text. */
PyObject *pyps_client_fail(pyps_client *self, int rc, const char *call, const char *err);

/* declare.c: the Client methods and attribute of run-time declarations. */
PyObject *pyps_client_declare(pyps_client *self, PyObject *args, PyObject *kw);
PyObject *pyps_client_declare_tables(pyps_client *self, PyObject *args);
PyObject *pyps_client_get_tables(pyps_client *self, void *closure);
PyObject *pyps_client_set_lr(pyps_client *self, PyObject *args);

/* arrays.c: the tensors of one dense call, from a mapping {name: array}. */
struct pyps_tset {
	struct ps_tensor *t;
	Py_buffer *v;
	int n;
};
/* Fills s from map against cfg (writable: for pulls); call names the call
 * in messages. 0, or -1 with an exception set and nothing held. */
int pyps_tset_get(struct pyps_tset *s, PyObject *map, const struct ps_config *cfg, int writable,
		  const char *call);
void pyps_tset_free(struct pyps_tset *s);
/* obj's memory as count float32 (what names it in messages); count < 0:
 * any number of them, and v's shape is filled. */
int pyps_get_f32(PyObject *obj, const char *what, int64_t count, int writable, Py_buffer *v);
/* An id array: C-contiguous uint64, or int64 >= 0. */
int pyps_get_ids(PyObject *obj, const char *call, const char *table, Py_buffer *v);
/* unique.c: ps._ps.unique_ids(ids, u, inv) -> k. */
PyObject *pyps_unique_ids(PyObject *m, PyObject *args);

/* ps.Handle of an asynchronous call. It owns the buffers the call reads
 * or writes (released when it completes) and one user of the client. */
typedef struct {
	PyObject_HEAD
	pyps_client *client;
	int64_t ids[2];          /* 0 once waited for */
	int nids;
	int status;              /* first failure */
	char err[512];
	int waiting;             /* a thread is in wait() */
	int finished;
	Py_buffer *views;
	int nviews;
	struct ps_tensor *tensors; /* pull: versions land here */
	int ntensors;
	void *extra;             /* another array libps reads until completion (pushpull's grads) */
	PyObject *result;        /* returned by wait() */
	const char *what;        /* "push", "pull", ... for messages */
} pyps_handle;
extern PyTypeObject *pyps_HandleType;

/* A new handle over what a call submitted; takes views, tensors
 * (PyMem_Malloc'ed) and a reference to result. */
PyObject *pyps_handle_new(pyps_client *client, const char *what, const int64_t *ids, int nids,
			  Py_buffer *views, int nviews, struct ps_tensor *tensors, int ntensors,
			  PyObject *result);

/* {name: element count} of cfg's tensors, in order (pyps.c). */
PyObject *pyps_tensors_dict(const struct ps_config *cfg);

/* The stats of one shard as a dict. */
PyObject *pyps_stats_dict(const struct ps_shard_stats *s);

int pyps_init_client(PyObject *m);
int pyps_init_handle(PyObject *m);

#endif
