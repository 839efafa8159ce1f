/* model_file.h - trained weights on disk (ps-worker --save-model / --eval).
 *
 * Layout (host byte order, little-endian on supported machines): the magic
 * "PSMODEL1", uint32 number of tensors, then per tensor uint32 name length,
 * the name, uint64 element count and count float32 values; last a CRC-32
 * (zlib) of everything before it. Written to a temporary file that is
 * fsynced and renamed, so a crash never leaves half a model under the name.
 */
#ifndef PS_MODEL_FILE_H
#define PS_MODEL_FILE_H

#include <stddef.h>
#include "config.h"

/* Writes the config's tensors, w[t] holding cfg->tensors[t].count floats.
 * 0, or a negative code with the reason in err. */
int ps_model_save(const char *path, const struct ps_config *cfg, float *const *w, char *err,
		  size_t errlen);

/* Reads path into w[t] (cfg->tensors[t].count floats each). The file must
 * hold exactly the config's tensors (names, order, counts): otherwise, or
 * when it is damaged, returns a negative code with the reason in err and
 * leaves w untouched. */
int ps_model_load(const char *path, const struct ps_config *cfg, float **w, char *err,
		  size_t errlen);

#endif
