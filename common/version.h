/* version.h - what `--version` prints, the same for every program: the
 * release, the wire protocol, and the build's optional parts (the rdma
 * transport and whether an RDMA device is here, the CUDA plug-in and where
 * it was found), so a bug report or a mixed cluster can be read at a glance. */
#ifndef PS_VERSION_H
#define PS_VERSION_H

#include <stdio.h>

/* Writes the --version text of program prog (e.g. "ps-server") to f. */
void ps__version_print(FILE *f, const char *prog);

/* Finds lib/ps-compute-cuda.so where ps-worker would look for it
 * (PS_COMPUTE_PLUGIN_DIR, then lib/ and lib/ps/ beside the program's folder,
 * then the install path). Writes the file found, or the folders tried,
 * into out; returns 1 found, 0 not. Checks presence only: opening it needs
 * the CUDA libraries, which --version must not. */
int ps__plugin_find(char *out, size_t len);

#endif
