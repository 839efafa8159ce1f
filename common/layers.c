/* layers.c - presets, shape inference and parameter tensors of a model. */
#include <stdio.h>
#include <string.h>
#include "layers.h"
#include "ps_err.h"

const char *ps_layer_kind_name(enum ps_layer_kind k)
{
	static const char *const names[] = { "dense", "conv2d", "maxpool", "relu", "flatten" };
	return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}

static void add(struct ps_model_cfg *m, enum ps_layer_kind kind, int out, int kernel, int pad,
		int size)
{
	struct ps_layer_cfg *l = &m->layers[m->nlayers++];

	memset(l, 0, sizeof(*l));
	l->kind = kind;
	l->out = out;
	l->kernel = kernel;
	l->pad = pad;
	l->stride = 1;
	l->size = size;
}

int ps_layers_preset(struct ps_model_cfg *m, const char *name)
{
	m->nlayers = 0;
	if (strcmp(name, "mlp") == 0) {
		/* 784-256-128-10 */
		add(m, PS_LAYER_FLATTEN, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 256, 0, 0, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 128, 0, 0, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 10, 0, 0, 0);
	} else if (strcmp(name, "cnn") == 0) {
		add(m, PS_LAYER_CONV2D, 32, 5, 2, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_MAXPOOL, 0, 0, 0, 2);
		add(m, PS_LAYER_CONV2D, 64, 5, 2, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_MAXPOOL, 0, 0, 0, 2);
		add(m, PS_LAYER_FLATTEN, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 256, 0, 0, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 10, 0, 0, 0);
	} else if (strcmp(name, "ctr") == 0) {
		/* [26 bags | 13 numeric] - 256 - 128 - 2 logits (logistic loss
		 * as a 2-class softmax: the same function of their difference) */
		add(m, PS_LAYER_DENSE, 256, 0, 0, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 128, 0, 0, 0);
		add(m, PS_LAYER_RELU, 0, 0, 0, 0);
		add(m, PS_LAYER_DENSE, 2, 0, 0, 0);
	} else {
		return PS_ECONFIG;
	}
	snprintf(m->preset, sizeof(m->preset), "%s", name);
	return 0;
}

int ps_layers_infer(const struct ps_model_cfg *m, struct ps_layer_shape *s, char *err,
		    size_t errlen)
{
	int c = m->input[0], h = m->input[1], w = m->input[2], t = 0;

	if (m->nlayers < 1) {
		snprintf(err, errlen, "the model has no layers");
		return PS_ECONFIG;
	}
	for (int i = 0; i < m->nlayers; i++) {
		const struct ps_layer_cfg *l = &m->layers[i];
		s[i].in_c = c;
		s[i].in_h = h;
		s[i].in_w = w;
		s[i].weight = s[i].bias = -1;
		switch (l->kind) {
		case PS_LAYER_DENSE:
			if (l->out < 1) {
				snprintf(err, errlen, "layer %d (dense): out must be >= 1", i + 1);
				return PS_ECONFIG;
			}
			c = l->out;
			h = w = 1;
			s[i].weight = t++;
			s[i].bias = t++;
			break;
		case PS_LAYER_CONV2D: {
			int st = l->stride ? l->stride : 1;
			int oh = (h + 2 * l->pad - l->kernel) / st + 1;
			int ow = (w + 2 * l->pad - l->kernel) / st + 1;
			if (l->out < 1 || l->kernel < 1 || l->pad < 0 || st < 1 ||
			    h + 2 * l->pad < l->kernel || w + 2 * l->pad < l->kernel) {
				snprintf(err, errlen,
					 "layer %d (conv2d): kernel %d with pad %d does not fit a %dx%d input",
					 i + 1, l->kernel, l->pad, h, w);
				return PS_ECONFIG;
			}
			c = l->out;
			h = oh;
			w = ow;
			s[i].weight = t++;
			s[i].bias = t++;
			break;
		}
		case PS_LAYER_MAXPOOL:
			if (l->size < 1 || h < l->size || w < l->size) {
				snprintf(err, errlen, "layer %d (maxpool): size %d does not fit a %dx%d input",
					 i + 1, l->size, h, w);
				return PS_ECONFIG;
			}
			h /= l->size;
			w /= l->size;
			break;
		case PS_LAYER_FLATTEN:
			c = c * h * w;
			h = w = 1;
			break;
		case PS_LAYER_RELU:
			break;
		}
		s[i].out_c = c;
		s[i].out_h = h;
		s[i].out_w = w;
	}
	if (c * h * w != m->classes) {
		snprintf(err, errlen, "the last layer gives %d outputs, the model has %d classes",
			 c * h * w, m->classes);
		return PS_ECONFIG;
	}
	return 0;
}

int ps_layers_tensors(const struct ps_model_cfg *m, struct ps_param_desc *out, int max,
		      char *err, size_t errlen)
{
	struct ps_layer_shape s[PS_MAX_LAYERS];
	int n = 0, ndense = 0, nconv = 0, rc;

	rc = ps_layers_infer(m, s, err, errlen);
	if (rc)
		return rc;
	for (int i = 0; i < m->nlayers; i++) {
		const struct ps_layer_cfg *l = &m->layers[i];
		char base[32];
		if (l->kind != PS_LAYER_DENSE && l->kind != PS_LAYER_CONV2D)
			continue;
		if (n + 2 > max) {
			snprintf(err, errlen, "the model has more than %d parameter tensors", max);
			return PS_ECONFIG;
		}
		struct ps_param_desc *wd = &out[n++], *bd = &out[n++];
		memset(wd, 0, sizeof(*wd));
		memset(bd, 0, sizeof(*bd));
		if (l->kind == PS_LAYER_DENSE) {
			int64_t in = (int64_t)s[i].in_c * s[i].in_h * s[i].in_w;
			snprintf(base, sizeof(base), "fc%d", ++ndense);
			wd->ndims = 2;
			wd->dims[0] = in;
			wd->dims[1] = l->out;
			wd->count = in * l->out;
			wd->fan_in = in;
		} else {
			snprintf(base, sizeof(base), "conv%d", ++nconv);
			wd->ndims = 4;
			wd->dims[0] = l->out;
			wd->dims[1] = s[i].in_c;
			wd->dims[2] = wd->dims[3] = l->kernel;
			wd->count = (int64_t)l->out * s[i].in_c * l->kernel * l->kernel;
			wd->fan_in = (int64_t)s[i].in_c * l->kernel * l->kernel;
		}
		snprintf(wd->name, sizeof(wd->name), "%s.weight", base);
		snprintf(bd->name, sizeof(bd->name), "%s.bias", base);
		bd->ndims = 1;
		bd->dims[0] = bd->count = l->out;
		bd->fan_in = wd->fan_in;
		bd->is_bias = 1;
	}
	return n;
}
