/* arrays.c - Python objects into what libps reads and writes: float32
 * arrays through the buffer protocol (no copies; dtype, layout, size and
 * device checked, each refusal naming the tensor and what was expected),
 * the {name: array} mapping of a dense call, and id arrays of rows calls.
 */
#include <string.h>
#include "pyps.h"

/* The reason the buffer protocol gave, as text (clears the error). */
static void take_reason(char *buf, size_t len)
{
	PyObject *type, *value, *tb, *s = NULL;
	Py_ssize_t n;
	const char *t = NULL;

	PyErr_Fetch(&type, &value, &tb);
	if (value && (s = PyObject_Str(value)))
		t = PyUnicode_AsUTF8AndSize(s, &n);
	snprintf(buf, len, "%s", t ? t : "no buffer interface");
	PyErr_Clear();
	Py_XDECREF(s);
	Py_XDECREF(type);
	Py_XDECREF(value);
	Py_XDECREF(tb);
}

/* The device of a framework tensor ("cuda:0"), or "" for host memory. */
static void device_of(PyObject *obj, char *buf, size_t len)
{
	PyObject *dev, *s;
	const char *t;
	Py_ssize_t n;

	buf[0] = 0;
	if (PyObject_HasAttrString(obj, "__cuda_array_interface__"))
		snprintf(buf, len, "cuda");
	dev = PyObject_GetAttrString(obj, "device");
	if (!dev) {
		PyErr_Clear();
		return;
	}
	s = PyObject_Str(dev);
	Py_DECREF(dev);
	if (!s) {
		PyErr_Clear();
		return;
	}
	t = PyUnicode_AsUTF8AndSize(s, &n);
	if (t && strcmp(t, "cpu") != 0 && strncmp(t, "cpu:", 4) != 0)
		snprintf(buf, len, "%s", t);
	Py_DECREF(s);
}

static int is_f32(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";

	if (*f == '<' || *f == '=' || *f == '@')
		f++;
	return v->itemsize == 4 && f[0] == 'f' && f[1] == 0;
}

/* Takes obj's memory as count float32 for tensor what ('name' or a table's
 * part); writable for pulls. 0, or -1 with ps.ArrayError set. */
int pyps_get_f32(PyObject *obj, const char *what, int64_t count, int writable, Py_buffer *v)
{
	int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
	char reason[256], dev[64];

	if (PyObject_GetBuffer(obj, v, flags) < 0) {
		PyObject *np, *det;

		take_reason(reason, sizeof(reason));
		device_of(obj, dev, sizeof(dev));
		if (dev[0]) {
			pyps_raise(PS_ESHAPE, "%s is on device %s; libps reads and writes host "
				   "memory: pass a CPU float32 array (t.detach().cpu().numpy(), "
				   "and copy pulled weights back)", what, dev);
			return -1;
		}
		/* A torch CPU tensor: its numpy() view shares the memory. */
		det = PyObject_HasAttrString(obj, "detach") ?
			PyObject_CallMethod(obj, "detach", NULL) : NULL;
		np = det && PyObject_HasAttrString(det, "numpy") ?
			PyObject_CallMethod(det, "numpy", NULL) : NULL;
		Py_XDECREF(det);
		PyErr_Clear();
		if (!np || PyObject_GetBuffer(np, v, flags) < 0) {
			if (np)
				take_reason(reason, sizeof(reason));
			Py_XDECREF(np);
			PyObject *tn = PyType_GetName(Py_TYPE(obj));
			const char *tname = tn ? PyUnicode_AsUTF8AndSize(tn, NULL) : NULL;
			PyErr_Clear();
			if (count < 0)
				pyps_raise(PS_ESHAPE, "%s: a %s was given (%s): a C-contiguous%s "
					   "float32 array expected", what, tname ? tname : "?", reason,
					   writable ? ", writable" : "");
			else
				pyps_raise(PS_ESHAPE, "%s: a %s was given (%s): a C-contiguous%s "
					   "float32 array of %lld elements expected", what,
					   tname ? tname : "?", reason, writable ? ", writable" : "",
					   (long long)count);
			Py_XDECREF(tn);
			return -1;
		}
		Py_DECREF(np); /* v->obj holds it */
	}
	if (!is_f32(v)) {
		pyps_raise(PS_ESHAPE, "%s: items of format '%s' (%zd bytes) given, float32 "
			   "expected", what, v->format ? v->format : "B", v->itemsize);
		goto err_release;
	}
	if (count >= 0 && v->len / 4 != count) {
		pyps_raise(PS_ESHAPE, "%s: %zd float32 given, %lld expected", what, v->len / 4,
			   (long long)count);
		goto err_release;
	}
	return 0;
err_release:
	PyBuffer_Release(v);
	return -1;
}

void pyps_tset_free(struct pyps_tset *s)
{
	for (int i = 0; i < s->n; i++)
		PyBuffer_Release(&s->v[i]);
	PyMem_Free(s->t);
	PyMem_Free(s->v);
	s->t = NULL;
	s->v = NULL;
	s->n = 0;
}

static int find_tensor(const struct ps_config *cfg, const char *name)
{
	for (int i = 0; i < ps_config_ntensors(cfg); i++)
		if (strcmp(ps_config_tensor_name(cfg, i), name) == 0)
			return i;
	return -1;
}

/* Fills s from mapping arg (what: "push", "pull") against cfg. */
int pyps_tset_get(struct pyps_tset *s, PyObject *map, const struct ps_config *cfg, int writable,
		    const char *call)
{
	PyObject *items = NULL;
	Py_ssize_t n;

	memset(s, 0, sizeof(*s));
	if (!PyDict_Check(map)) {
		if (!PyMapping_Check(map) || !(items = PyMapping_Items(map))) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "%s: tensors are a mapping {name: float32 array}, got "
				   "a %s", call, Py_TYPE(map) ? "non-mapping" : "?");
			return -1;
		}
		n = PyList_Size(items);
	} else {
		n = PyDict_Size(map);
	}
	if (n == 0) {
		Py_XDECREF(items);
		pyps_raise(-EINVAL, "%s: no tensors given", call);
		return -1;
	}
	s->t = PyMem_Calloc((size_t)n, sizeof(*s->t));
	s->v = PyMem_Calloc((size_t)n, sizeof(*s->v));
	if (!s->t || !s->v) {
		Py_XDECREF(items);
		pyps_tset_free(s);
		PyErr_NoMemory();
		return -1;
	}
	Py_ssize_t pos = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *key, *val;
		const char *name;
		char what[200];
		int k;

		if (items) {
			PyObject *kv = PyList_GetItem(items, i);
			key = PyTuple_GetItem(kv, 0);
			val = PyTuple_GetItem(kv, 1);
		} else if (!PyDict_Next(map, &pos, &key, &val)) {
			break;
		}
		if (!PyUnicode_Check(key) || !(name = PyUnicode_AsUTF8AndSize(key, NULL))) {
			PyErr_Clear();
			pyps_raise(-EINVAL, "%s: tensor names are str", call);
			goto err_free;
		}
		k = find_tensor(cfg, name);
		if (k < 0) {
			pyps_raise(PS_ENOTENSOR, "%s: tensor '%s' is not in the model of %s "
				   "(Config.tensors lists them)", call, name, ps_config_path(cfg));
			goto err_free;
		}
		snprintf(what, sizeof(what), "%s: tensor '%s'", call, name);
		if (pyps_get_f32(val, what, ps_config_tensor_count(cfg, k), writable, &s->v[i]) < 0)
			goto err_free;
		s->n = (int)i + 1;
		s->t[i].name = ps_config_tensor_name(cfg, k); /* lives as long as cfg */
		s->t[i].data = s->v[i].buf;
		s->t[i].count = ps_config_tensor_count(cfg, k);
	}
	Py_XDECREF(items);
	return 0;
err_free:
	Py_XDECREF(items);
	pyps_tset_free(s);
	return -1;
}

/* ids: a C-contiguous buffer of 8-byte integers (uint64 or int64 >= 0). */
int pyps_get_ids(PyObject *obj, const char *call, const char *table, Py_buffer *v)
{
	char reason[256];
	const char *f;

	if (PyObject_GetBuffer(obj, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
		take_reason(reason, sizeof(reason));
		pyps_raise(PS_ESHAPE, "%s '%s': ids: %s: a C-contiguous uint64 or int64 array "
			   "expected", call, table, reason);
		return -1;
	}
	f = v->format ? v->format : "B";
	if (*f == '<' || *f == '=' || *f == '@')
		f++;
	if (v->itemsize != 8 || !strchr("lqLQ", f[0]) || f[1]) {
		pyps_raise(PS_ESHAPE, "%s '%s': ids of format '%s' (%zd bytes) given, uint64 or "
			   "int64 expected", call, table, v->format ? v->format : "B",
			   v->itemsize);
		goto err_release;
	}
	if (f[0] == 'l' || f[0] == 'q') {
		const int64_t *p = v->buf;
		for (Py_ssize_t i = 0; i < v->len / 8; i++)
			if (p[i] < 0) {
				pyps_raise(PS_ESHAPE, "%s '%s': ids[%zd] = %lld: ids are 0 or more",
					   call, table, i, (long long)p[i]);
				goto err_release;
			}
	}
	return 0;
err_release:
	PyBuffer_Release(v);
	return -1;
}
