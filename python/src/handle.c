/* handle.c - ps._ps.Handle: the completion of an asynchronous call.
 *
 * wait(timeout=None) blocks with the GIL released until every request of
 * the call completed (or the timeout passed: ps.TimeoutError, and the
 * handle may be waited for again), then releases the arrays the call used
 * and returns the call's result or raises its error. done() tells without
 * blocking. A handle dropped without a wait waits in its destructor, so
 * the arrays it holds are never released while libps still uses them.
 */
#include <math.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include "pyps.h"

PyTypeObject *pyps_HandleType;

PyObject *pyps_handle_new(pyps_client *client, const char *what, const int64_t *ids, int nids,
			  Py_buffer *views, int nviews, struct ps_tensor *tensors, int ntensors,
			  PyObject *result)
{
	pyps_handle *h = PyObject_New(pyps_handle, pyps_HandleType);

	if (!h) {
		/* the requests are in flight over these arrays: let them finish */
		Py_BEGIN_ALLOW_THREADS
		for (int i = 0; i < nids; i++)
			ps_client_wait(client->c, ids[i]);
		Py_END_ALLOW_THREADS
		for (int i = 0; i < nviews; i++)
			PyBuffer_Release(&views[i]);
		PyMem_Free(views);
		PyMem_Free(tensors);
		Py_XDECREF(result);
		pyps_client_leave(client);
		return NULL;
	}
	Py_INCREF((PyObject *)client);
	h->client = client; /* with the use pyps_client_enter counted */
	h->ids[0] = ids[0];
	h->ids[1] = nids > 1 ? ids[1] : 0;
	h->nids = nids;
	h->status = 0;
	h->err[0] = 0;
	h->waiting = 0;
	h->finished = 0;
	h->views = views;
	h->nviews = nviews;
	h->tensors = tensors;
	h->ntensors = ntensors;
	h->result = result;
	h->what = what;
	h->extra = NULL;
	return (PyObject *)h;
}

/* Releases the arrays and the client once every request completed. */
static void finish(pyps_handle *h)
{
	if (h->finished)
		return;
	h->finished = 1;
	if (h->ntensors > 0 && !h->result && h->status == 0) {
		uint64_t v = UINT64_MAX;
		for (int i = 0; i < h->ntensors; i++)
			if (h->tensors[i].version < v)
				v = h->tensors[i].version;
		h->result = PyLong_FromUnsignedLongLong(v);
		if (!h->result)
			PyErr_Clear(); /* wait() reports the missing result */
	}
	for (int i = 0; i < h->nviews; i++)
		PyBuffer_Release(&h->views[i]);
	PyMem_Free(h->views);
	PyMem_Free(h->tensors);
	PyMem_Free(h->extra);
	h->views = NULL;
	h->tensors = NULL;
	h->extra = NULL;
	h->nviews = h->ntensors = 0;
	pyps_client_leave(h->client);
}

/* Waits for the requests still pending, timeout_s < 0: for ever.
 * Returns 0, or PS_ETIMEDOUT with some still pending. GIL released. */
static int wait_ids(pyps_handle *h, double timeout_s)
{
	struct ps_client *c = h->client->c;
	double left = timeout_s;
	struct timespec t0, t1;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* the last id first: a pushpull's pull is answered after its push is
	 * applied, so waiting for it first saves a wake-up */
	for (int i = h->nids - 1; i >= 0; i--) {
		if (!h->ids[i])
			continue;
		rc = ps_client_wait_timeout(c, h->ids[i], left);
		/* PS_ETIMEDOUT is also a request's own status: then the wait
		 * consumed the id and it is no longer pending */
		if (rc == PS_ETIMEDOUT && ps_client_done(c, h->ids[i]) >= 0)
			return PS_ETIMEDOUT; /* still pending: wait() may be called again */
		h->ids[i] = 0;
		if (rc < 0 && !h->status) {
			h->status = rc;
			snprintf(h->err, sizeof(h->err), "%s", ps_client_error(c));
		}
		if (timeout_s >= 0) {
			clock_gettime(CLOCK_MONOTONIC, &t1);
			left = timeout_s - ((double)(t1.tv_sec - t0.tv_sec) +
					    (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
			if (left < 0)
				left = 0;
		}
	}
	return 0;
}

static PyObject *handle_wait(pyps_handle *h, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tobj = Py_None;
	double timeout_s = -1;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwlist, &tobj))
		return NULL;
	if (tobj != Py_None) {
		timeout_s = PyFloat_AsDouble(tobj);
		if (timeout_s == -1 && PyErr_Occurred())
			return NULL;
		if (!(timeout_s >= 0) || isinf(timeout_s))
			return pyps_raise(-EINVAL, "wait: timeout %g: seconds >= 0, or None",
					  timeout_s);
	}
	if (!h->finished) {
		if (h->client->pid != getpid())
			return pyps_raise(PS_ESTATE, "this %s handle belongs to process %d, which "
					  "connected its client; it cannot be waited for after "
					  "fork() (process %d)", h->what, (int)h->client->pid,
					  (int)getpid());
		if (h->waiting)
			return pyps_raise(PS_ESTATE, "another thread is waiting for this %s "
					  "handle", h->what);
		h->waiting = 1;
		Py_BEGIN_ALLOW_THREADS
		rc = wait_ids(h, timeout_s);
		Py_END_ALLOW_THREADS
		h->waiting = 0;
		if (rc == PS_ETIMEDOUT)
			return pyps_raise(PS_ETIMEDOUT, "%s: not complete within %g s (still "
					  "pending: wait again)", h->what, timeout_s);
		finish(h);
	}
	if (h->status)
		return pyps_raise(h->status, "%s: %s", h->what, h->err[0] ? h->err :
				  ps_strerror(h->status));
	if (!h->result)
		Py_RETURN_NONE;
	Py_INCREF(h->result);
	return h->result;
}

static PyObject *handle_done(pyps_handle *h, PyObject *noarg)
{
	(void)noarg;
	if (h->finished)
		Py_RETURN_TRUE;
	if (h->client->pid != getpid())
		return pyps_raise(PS_ESTATE, "this %s handle cannot be used after fork()",
				  h->what);
	for (int i = 0; i < h->nids; i++)
		if (h->ids[i] && ps_client_done(h->client->c, h->ids[i]) == 0)
			Py_RETURN_FALSE;
	Py_RETURN_TRUE;
}

static void handle_dealloc(pyps_handle *h)
{
	PyTypeObject *tp = Py_TYPE((PyObject *)h);

	if (!h->finished) {
		if (h->client->pid == getpid()) {
			Py_BEGIN_ALLOW_THREADS
			wait_ids(h, -1);
			Py_END_ALLOW_THREADS
			finish(h);
		} /* a forked child: the parent's requests are not ours to wait for */
	}
	Py_XDECREF(h->result);
	Py_DECREF((PyObject *)h->client);
	PyObject_Free(h);
	Py_DECREF(tp);
}

static PyObject *handle_repr(pyps_handle *h)
{
	return PyUnicode_FromFormat("<ps.Handle %s %s>", h->what,
				    h->finished ? "finished" : "in flight");
}

static PyMethodDef handle_methods[] = {
	{ "wait", (PyCFunction)(void (*)(void))handle_wait, METH_VARARGS | METH_KEYWORDS,
	  "wait(timeout=None): blocks until the call completes; returns its result or raises "
	  "its error (ps.TimeoutError past timeout seconds: wait again)" },
	{ "done", (PyCFunction)handle_done, METH_NOARGS,
	  "True when wait() will not block" },
	{ NULL, NULL, 0, NULL },
};

static PyType_Slot handle_slots[] = {
	{ Py_tp_dealloc, handle_dealloc },
	{ Py_tp_methods, handle_methods },
	{ Py_tp_repr, handle_repr },
	{ Py_tp_doc, "The completion of an asynchronous call (returned by *_async)." },
	{ 0, NULL },
};

static PyType_Spec handle_spec = {
	"ps._ps.Handle", sizeof(pyps_handle), 0, Py_TPFLAGS_DEFAULT, handle_slots,
};

int pyps_init_handle(PyObject *m)
{
	pyps_HandleType = (PyTypeObject *)PyType_FromSpec(&handle_spec);
	if (!pyps_HandleType)
		return -1;
	return PyModule_AddObjectRef(m, "Handle", (PyObject *)pyps_HandleType);
}
