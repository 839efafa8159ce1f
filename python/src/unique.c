/* unique.c - ps._ps.unique_ids: the distinct ids of a batch and, for each
 * position, the index of its id among them, in one pass over a hash table.
 *
 * An embedding module pulls each distinct row once and looks the batch up
 * in what came back (python/ps/torch.py). numpy's unique sorts (n log n:
 * 1.3 ms for the 26,624 ids of a DLRM batch, a tenth of its step on this
 * machine); the shards need no order, so the ids come out in the order of
 * their first occurrence, which is as deterministic.
 */
#include <stdlib.h>
#include <string.h>
#include "pyps.h"

/* Fibonacci hashing: ids are often dense small integers, whose low bits
 * alone would fill neighbouring slots. */
static inline size_t slot_of(uint64_t id, int shift)
{
	return (size_t)((id * 0x9E3779B97F4A7C15ull) >> shift);
}

/* The distinct values of ids[0..n) into u (first occurrence order), the
 * index into u of each position into inv; returns how many, or -1 when
 * the table cannot be allocated. */
static Py_ssize_t unique(const uint64_t *ids, Py_ssize_t n, uint64_t *u, int64_t *inv)
{
	int bits = 4;
	size_t cap, mask;
	int64_t *slots; /* index into u, or -1 */
	Py_ssize_t k = 0;

	while (((size_t)1 << bits) < (size_t)n * 2)
		bits++;
	cap = (size_t)1 << bits;
	mask = cap - 1;
	slots = malloc(cap * sizeof(*slots));
	if (!slots)
		return -1;
	memset(slots, 0xff, cap * sizeof(*slots));
	for (Py_ssize_t i = 0; i < n; i++) {
		uint64_t id = ids[i];
		size_t s = slot_of(id, 64 - bits);

		while (slots[s] >= 0 && u[slots[s]] != id)
			s = (s + 1) & mask;
		if (slots[s] < 0) {
			slots[s] = k;
			u[k++] = id;
		}
		inv[i] = slots[s];
	}
	free(slots);
	return k;
}

/* unique_ids(ids, u, inv) -> k: ids a C-contiguous uint64 or int64 (>= 0)
 * array; u (8-byte integers) and inv (int64) writable arrays of at least
 * as many elements. u[:k] are the distinct ids, ids[i] == u[inv[i]]. */
PyObject *pyps_unique_ids(PyObject *m, PyObject *args)
{
	PyObject *ids_o, *u_o, *inv_o, *ret = NULL;
	Py_buffer ids, u, inv;
	Py_ssize_t n, k;

	(void)m;
	if (!PyArg_ParseTuple(args, "OOO:unique_ids", &ids_o, &u_o, &inv_o))
		return NULL;
	if (pyps_get_ids(ids_o, "unique_ids", "ids", &ids) < 0)
		return NULL;
	n = ids.len / 8;
	if (PyObject_GetBuffer(u_o, &u, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		goto out_ids;
	if (PyObject_GetBuffer(inv_o, &inv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		goto out_u;
	if (u.itemsize != 8 || inv.itemsize != 8 || u.len < ids.len || inv.len < ids.len) {
		pyps_raise(PS_ESHAPE, "unique_ids: u and inv must be writable 8-byte arrays of at "
			   "least %zd elements (%zd and %zd given)", n, u.len / 8, inv.len / 8);
		goto out_inv;
	}
	Py_BEGIN_ALLOW_THREADS
	k = unique(ids.buf, n, u.buf, inv.buf);
	Py_END_ALLOW_THREADS
	ret = k < 0 ? PyErr_NoMemory() : PyLong_FromSsize_t(k);
out_inv:
	PyBuffer_Release(&inv);
out_u:
	PyBuffer_Release(&u);
out_ids:
	PyBuffer_Release(&ids);
	return ret;
}
