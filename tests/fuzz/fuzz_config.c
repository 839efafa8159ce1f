/* fuzz_config.c - libFuzzer target: the YAML config loader on arbitrary
 * text (libyaml parsing, the option table's type and bound checks, model
 * layers and tensors, per-tensor compression overrides). It must accept or
 * refuse with a message, never crash, leak or hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ps_config cfg;
	char err[1024], *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0;
	ps_config_load_string(&cfg, text, "fuzz.yaml", err, sizeof(err));
	free(text);
	return 0;
}
