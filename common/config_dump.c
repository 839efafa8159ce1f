/* config_dump.c - the effective configuration as YAML (--dump-config;
 * it loads back as the same configuration) and the --help text, both
 * generated from the option tables of config_table.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "config.h"
#include "config_int.h"
#include "ps_err.h"

/* Writes s as a YAML double-quoted scalar that loads back as the same
 * bytes: '"' and '\' escaped, control characters (which would end the
 * line or be refused by the YAML reader) as escapes, valid UTF-8 as it is
 * but for what YAML reads as a line break or does not allow raw (C1
 * controls, U+2028, U+2029, the BOM), written as \u escapes. A byte that
 * is not UTF-8 has no YAML spelling: it is written as a \x escape (the code
 * point of that byte), so the reloaded text differs there. */
static void yaml_str(FILE *out, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	fputc('"', out);
	while (*p) {
		unsigned c = *p, cp, n;

		if (c == '"' || c == '\\') {
			fputc('\\', out);
			fputc((int)c, out);
			p++;
			continue;
		}
		if (c < 0x80) {
			if (c == '\n')
				fputs("\\n", out);
			else if (c == '\t')
				fputs("\\t", out);
			else if (c < 0x20 || c == 0x7f)
				fprintf(out, "\\x%02x", c);
			else
				fputc((int)c, out);
			p++;
			continue;
		}
		/* a UTF-8 sequence: its length and code point, or an odd byte */
		n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
		if (c >= 0xf5)
			n = 0;
		cp = n == 4 ? c & 0x07 : n == 3 ? c & 0x0f : c & 0x1f;
		for (unsigned k = 1; k < n; k++) {
			if ((p[k] & 0xc0) != 0x80) {
				n = 0;
				break;
			}
			cp = cp << 6 | (p[k] & 0x3f);
		}
		if (n && ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) ||
			  (n == 4 && (cp < 0x10000 || cp > 0x10ffff))))
			n = 0; /* overlong, a surrogate, or past Unicode */
		if (!n) {
			fprintf(out, "\\x%02x", c);
			p++;
		} else if (cp < 0xa0 || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff) {
			fprintf(out, "\\u%04x", cp);
			p += n;
		} else {
			fwrite(p, 1, n, out);
			p += n;
		}
	}
	fputc('"', out);
}

/* Layers given explicitly are written out; a preset's are not (the preset
 * line says it), so that the dump loads back as the same configuration. */
static void dump_layers(const struct ps_config *cfg, FILE *out)
{
	const struct ps_model_cfg *m = &cfg->model;

	if (!m->nlayers || m->preset[0]) {
		fputs("[]\n", out);
		return;
	}
	fputc('\n', out);
	for (int i = 0; i < m->nlayers; i++) {
		const struct ps_layer_cfg *l = &m->layers[i];

		fprintf(out, "    - {type: %s", cfg_layer_names[l->kind]);
		if (l->kind == PS_LAYER_DENSE)
			fprintf(out, ", out: %d", l->out);
		else if (l->kind == PS_LAYER_CONV2D)
			fprintf(out, ", out: %d, kernel: %d, pad: %d, stride: %d", l->out, l->kernel,
				l->pad, l->stride);
		else if (l->kind == PS_LAYER_MAXPOOL)
			fprintf(out, ", size: %d", l->size);
		fputs("}\n", out);
	}
}

/* The tensors whose codec or ratio differ from the section's, as the
 * compression.tensors entries that give them (a list that loads back to the
 * same tensors, not necessarily the one in the file). */
static void dump_overrides(const struct ps_config *cfg, FILE *out)
{
	const struct ps_compress_cfg *cc = &cfg->compress;
	char buf[32];
	int n = 0;

	/* a config without a model: its entries, applied once declared */
	for (int k = 0; cfg->declare && k < cfg->ndecl_ovr; k++) {
		const struct ps_decl_override *d = &cfg->decl_ovr[k];

		fprintf(out, "%s    - {name: ", n++ ? "" : "\n");
		yaml_str(out, d->name);
		if (d->has_codec)
			fprintf(out, ", codec: %s", cfg_codec_names[d->codec]);
		if (d->has_ratio)
			fprintf(out, ", ratio: %s", cfg_fmt_float(d->ratio, buf, sizeof(buf)));
		fputs("}\n", out);
	}
	for (int i = 0; !cfg->declare && i < cfg->ntensors; i++) {
		const struct ps_tensor_cfg *t = &cfg->tensors[i];
		int ratio = t->codec == PS_CODEC_TOPK && t->ratio != cc->ratio;

		if (t->codec == cc->codec && !ratio)
			continue;
		fprintf(out, "%s    - {name: ", n++ ? "" : "\n");
		yaml_str(out, t->name);
		fprintf(out, ", codec: %s", cfg_codec_names[t->codec]);
		if (ratio)
			fprintf(out, ", ratio: %s", cfg_fmt_float(t->ratio, buf, sizeof(buf)));
		fputs("}\n", out);
	}
	if (!n)
		fputs(" []\n", out);
}

/* model.embeddings: every key of every entry, so the dump loads back the same. */
static void dump_tables(const struct ps_config *cfg, FILE *out)
{
	char b[16][32];

	fputs(cfg->ntables ? "\n" : "[]\n", out);
	for (int i = 0; i < cfg->ntables; i++) {
		const struct ps_table_cfg *t = &cfg->tables[i];

		fputs("    - name: ", out);
		yaml_str(out, t->name);
		fprintf(out, "\n      dim: %d\n      init: %s\n", t->dim, cfg_init_names[t->init]);
		if (t->init == PS_INIT_CONST || t->init == PS_INIT_UNIFORM || t->init == PS_INIT_NORMAL)
			fprintf(out, "      %s: %s\n", t->init == PS_INIT_CONST ? "value" : "scale",
				cfg_fmt_float(t->init_value, b[0], sizeof(b[0])));
		fprintf(out, "      optimizer: %s\n      lr: %s\n      eps: %s\n      beta1: %s\n"
			"      beta2: %s\n      initial_accumulator: %s\n      l1: %s\n      l2: %s\n"
			"      ftrl_beta: %s\n      admission: %d\n      ttl: %d\n"
			"      max_rows: %" PRId64 "\n      filter_ids: %" PRId64 "\n",
			cfg_row_optim_names[t->optimizer], cfg_fmt_float(t->lr, b[1], 32),
			cfg_fmt_float(t->eps, b[2], 32), cfg_fmt_float(t->beta1, b[3], 32),
			cfg_fmt_float(t->beta2, b[4], 32),
			cfg_fmt_float(t->initial_accumulator, b[5], 32),
			cfg_fmt_float(t->l1, b[6], 32), cfg_fmt_float(t->l2, b[7], 32),
			cfg_fmt_float(t->ftrl_beta, b[8], 32), t->admission, t->ttl_s, t->max_rows,
			t->filter_ids);
		if (!strcmp(cfg->model.preset, "ctr")) { /* as resolved: which fields bag from it */
			char list[100];
			fprintf(out, "      fields: [%s]\n",
				cfg_field_list(t->fields, list, sizeof(list)));
		}
	}
}

static void dump_value(const struct ps_config *cfg, const struct opt *o, FILE *out)
{
	const char *src = (const char *)cfg + o->off;
	char buf[PS_HOST_MAX + 16];

	if ((o->type != T_TENSORS || !cfg->ntensors) && o->type != T_OVERRIDES &&
	    (o->type != T_TABLES || !cfg->ntables))
		fputc(' ', out);
	switch (o->type) {
	case T_INT:
		fprintf(out, "%d\n", *(const int *)src);
		break;
	case T_U64:
		fprintf(out, "%" PRIu64 "\n", *(const uint64_t *)src);
		break;
	case T_SIZE:
		fprintf(out, "%s\n", cfg_fmt_size(o->size == sizeof(uint32_t) ? *(const uint32_t *)src
					      : *(const uint64_t *)src, buf, sizeof(buf)));
		break;
	case T_FLOAT:
		fprintf(out, "%s\n", cfg_fmt_float(*(const float *)src, buf, sizeof(buf)));
		break;
	case T_BOOL:
		fprintf(out, "%s\n", *(const int *)src ? "true" : "false");
		break;
	case T_ENUM:
		fprintf(out, "%s\n", o->names[*(const int *)src]);
		break;
	case T_ENUMSTR:
		fprintf(out, "%s\n", *src ? src : o->names[0]);
		break;
	case T_ADDR:
	case T_PATH:
		yaml_str(out, src);
		fputc('\n', out);
		break;
	case T_SERVERS: {
		int backups = o->off == offsetof(struct ps_config, backups);
		fputc('[', out);
		for (int i = 0; i < (backups ? cfg->nbackups : cfg->nshards); i++) {
			cfg_fmt_endpoint(backups ? &cfg->backups[i] : &cfg->shards[i], buf, sizeof(buf));
			fputs(i ? ", " : "", out);
			yaml_str(out, buf);
		}
		fputs("]\n", out);
		break;
	}
	case T_TENSORS:
		fputs(cfg->ntensors ? "\n" : "[]\n", out);
		for (int i = 0; i < cfg->ntensors; i++) {
			const struct ps_tensor_cfg *t = &cfg->tensors[i];

			fputs("    - name: ", out);
			yaml_str(out, t->name);
			fputs("\n      shape: [", out);
			for (int d = 0; d < t->ndims; d++)
				fprintf(out, "%s%" PRId64, d ? ", " : "", t->dims[d]);
			fprintf(out, "]\n      init: %s\n", cfg_init_names[t->init]);
			if (t->init == PS_INIT_CONST || t->init == PS_INIT_UNIFORM ||
			    t->init == PS_INIT_NORMAL)
				fprintf(out, "      %s: %s\n", t->init == PS_INIT_CONST ? "value" : "scale",
					cfg_fmt_float(t->init_value, buf, sizeof(buf)));
		}
		break;
	case T_DIMS3:
		fprintf(out, "[%d, %d, %d]\n", cfg->model.input[0], cfg->model.input[1],
			cfg->model.input[2]);
		break;
	case T_LAYERS:
		dump_layers(cfg, out);
		break;
	case T_OVERRIDES:
		dump_overrides(cfg, out);
		break;
	case T_TABLES:
		dump_tables(cfg, out);
		break;
	default:
		fputs("~\n", out);
		break;
	}
}

void ps_config_dump(const struct ps_config *cfg, FILE *out)
{
	char section[KEY_MAX] = "";
	const char *dot;

	fprintf(out, "# effective configuration\n");
	for (size_t i = 0; i < NCFG; i++) {
		const struct opt *o = &cfg_opts[i];
		size_t sl;

		/* options of one section are adjacent in the table */
		dot = strchr(o->key, '.');
		sl = dot ? (size_t)(dot - o->key) : 0;
		if (sl != strlen(section) || strncmp(section, o->key, sl)) {
			snprintf(section, sizeof(section), "%.*s", (int)sl, o->key);
			if (sl)
				fprintf(out, "%s:\n", section);
		}
		if (o->type == T_TENSORS && cfg->declare) {
			/* left out, so that the dump loads back without a model */
			fprintf(out, "  # tensors: declared by the workers at run time\n");
			continue;
		}
		if (o->type == T_TENSORS && cfg->model.nlayers) {
			fprintf(out, "  # tensors: derived from the layers:");
			for (int t = 0; t < cfg->ntensors; t++)
				fprintf(out, " %s[%" PRId64 "]", cfg->tensors[t].name,
					cfg->tensors[t].count);
			fputc('\n', out);
			continue;
		}
		if (o->type == T_LAYERS && (!cfg->model.nlayers || cfg->model.preset[0]))
			continue;
		fprintf(out, "%s%s:", sl ? "  " : "", sl ? dot + 1 : o->key);
		dump_value(cfg, o, out);
	}
}

static void help_opt(FILE *out, const struct opt *o, const char *prefix)
{
	char desc[200];

	fprintf(out, "  %s%s\n      %s; ", prefix, o->key, cfg_describe(o, desc, sizeof(desc)));
	if (o->flags & F_REQUIRED)
		fprintf(out, "required\n");
	else if (o->def)
		fprintf(out, "default %s\n", *o->def ? o->def : "\"\"");
	else
		fprintf(out, "optional\n");
	fprintf(out, "      %s\n", o->help);
}

void ps_config_help(FILE *out)
{
	fprintf(out, "Configuration file (YAML; key a.b is key b in the mapping a):\n");
	for (size_t i = 0; i < NCFG; i++) {
		help_opt(out, &cfg_opts[i], "");
		if (cfg_opts[i].type == T_TENSORS)
			for (size_t j = 0; j < NTENSOR; j++)
				help_opt(out, &cfg_tensor_opts[j], "model.tensors[].");
		if (cfg_opts[i].type == T_LAYERS)
			for (size_t j = 0; j < NLAYER; j++)
				help_opt(out, &cfg_layer_opts[j], "model.layers[].");
		if (cfg_opts[i].type == T_TABLES)
			for (size_t j = 0; j < NTABLE; j++)
				help_opt(out, &cfg_table_opts[j], "model.embeddings[].");
		if (cfg_opts[i].type == T_OVERRIDES)
			for (size_t j = 0; j < NOVR; j++)
				help_opt(out, &cfg_override_opts[j], "compression.tensors[].");
	}
}

const char *ps_optim_name(enum ps_optim_kind k)
{
	return (unsigned)k <= PS_OPT_ADAMW ? cfg_optim_names[k] : k == PS_OPT_REDUCE ? "reduce" : "unknown";
}

const char *ps_row_optim_name(int k)
{
	return k >= 0 && k < PS_ROPT_COUNT ? cfg_row_optim_names[k] : "unknown";
}

int ps_row_optim_nstate(const struct ps_table_cfg *t)
{
	switch (t->optimizer) {
	case PS_ROPT_ADAGRAD:
		return t->dim;
	case PS_ROPT_ROWWISE_ADAGRAD:
		return 1;
	case PS_ROPT_ADAM:
		return 2 * t->dim + 1; /* m, v, and the row's step count */
	case PS_ROPT_FTRL:
		return 2 * t->dim;     /* z, n */
	default:
		return 0;
	}
}

int ps_config_find_table(const struct ps_config *cfg, const char *name)
{
	for (int i = 0; i < cfg->ntables; i++)
		if (!strcmp(cfg->tables[i].name, name))
			return i;
	return PS_ENOTENSOR;
}
