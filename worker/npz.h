/* npz.h - writes NumPy .npz files (a zip of .npy members, stored without
 * compression) for ps-export (worker/ps_export.c).
 *
 * Members are streamed: a member is begun, its bytes are written (the
 * CRC-32 the zip format asks for is computed on the way) and it is ended,
 * which patches its local header. Sizes and offsets past 4 GiB use the
 * zip64 extensions, so a table of any size fits one file. The file is
 * written under PATH.tmp.XXXXXX and renamed to PATH by ps__npz_close, so a
 * failed export never leaves a partial PATH behind. Every member carries
 * the same fixed time stamp (1980-01-01): exporting the same checkpoints
 * twice gives identical bytes.
 */
#ifndef PS_NPZ_H
#define PS_NPZ_H

#include <stddef.h>
#include <stdint.h>

struct ps_npz;

/* Creates the temporary file next to path. 0 or a negative code with the
 * reason (naming the file) in err; *z is set on success. */
int ps__npz_open(struct ps_npz **z, const char *path, char *err, size_t errlen);

/* Begins member name (a path inside the zip, e.g. "dense/w.npy"). */
int ps__npz_begin(struct ps_npz *z, const char *name);
/* Appends n bytes to the member begun. */
int ps__npz_write(struct ps_npz *z, const void *p, size_t n);
/* Ends the member begun. */
int ps__npz_end(struct ps_npz *z);

/* Begins an .npy member: its header for an array of dtype descr ("<f4",
 * "<u8") and shape dims[0..ndims) in C order; the caller then writes the
 * elements with ps__npz_write and ends it. */
int ps__npz_begin_npy(struct ps_npz *z, const char *name, const char *descr,
		      const int64_t *dims, int ndims);

/* A whole .npy member from one buffer. */
int ps__npz_add_npy(struct ps_npz *z, const char *name, const char *descr,
		    const int64_t *dims, int ndims, const void *data, size_t bytes);

/* Writes the central directory, fsyncs, renames the file to its path and
 * frees z. With keep == 0 (an error happened) removes the temporary file
 * instead. 0 or a negative code with the reason in err. */
int ps__npz_close(struct ps_npz *z, int keep, char *err, size_t errlen);

#endif
