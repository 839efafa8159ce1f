/* layers.h - a model as a list of layers, its presets, and shape inference.
 *
 * The config names a model either by preset (mlp, cnn) or by an explicit
 * list of layers; the parameter tensors the shards hold are derived from it
 * (ps_layers_tensors), so the servers and workers agree on them by
 * construction. Layer kinds: dense (out), conv2d (out filters, kernel, pad,
 * stride), maxpool (size), relu, flatten. A dense layer flattens its input.
 */
#ifndef PS_LAYERS_H
#define PS_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#define PS_MAX_LAYERS 64

enum ps_layer_kind { PS_LAYER_DENSE, PS_LAYER_CONV2D, PS_LAYER_MAXPOOL, PS_LAYER_RELU,
		     PS_LAYER_FLATTEN };

struct ps_layer_cfg {
	enum ps_layer_kind kind;
	int out;          /* dense: outputs; conv2d: filters */
	int kernel;       /* conv2d: square kernel size */
	int pad;          /* conv2d: zero padding */
	int stride;       /* conv2d: stride (default 1) */
	int size;         /* maxpool: window and stride */
};

struct ps_model_cfg {
	char preset[16];  /* "" (explicit layers), "mlp", "cnn" or "ctr" */
	int nlayers;
	struct ps_layer_cfg layers[PS_MAX_LAYERS];
	int input[3];     /* channels, height, width of one example */
	int classes;      /* outputs of the last layer */
	int bag;          /* ctr: enum ps_bag_mode (compute.h) of the fields' bags */
};

/* Shapes of one layer for one example (c x h x w; dense output is out x 1 x 1). */
struct ps_layer_shape {
	int in_c, in_h, in_w;
	int out_c, out_h, out_w;
	int weight, bias; /* tensor indices in ps_layers_tensors order, -1 if none */
};

/* ctr: categorical fields bagged from the first embedding table and
 * numeric features, the dense part's input being fields x dim + numeric. */
#define PS_CTR_FIELDS 26
#define PS_CTR_NUMERIC 13

/* Fills m->layers from a preset name; PS_ECONFIG if unknown. ctr's input
 * shape depends on the table's dim: the config sets it (config.c). */
int ps_layers_preset(struct ps_model_cfg *m, const char *name);

/* Computes every layer's shapes. Fails (PS_ECONFIG, reason in err naming the
 * layer by 1-based position) when a layer does not fit its input or the last
 * layer's output is not `classes` values. */
int ps_layers_infer(const struct ps_model_cfg *m, struct ps_layer_shape *shapes, char *err,
		    size_t errlen);

/* One parameter tensor of the model: name ("conv1.weight", "fc2.bias"),
 * dims, count and fan-in (for initialisation). */
struct ps_param_desc {
	char name[64];
	int ndims;
	int64_t dims[4];
	int64_t count;
	int64_t fan_in;
	int is_bias;
};

/* Lists the parameter tensors of the layers in order (weight then bias of
 * each dense/conv2d layer). Returns how many (<= max), or PS_ECONFIG. */
int ps_layers_tensors(const struct ps_model_cfg *m, struct ps_param_desc *out, int max,
		      char *err, size_t errlen);

const char *ps_layer_kind_name(enum ps_layer_kind k);

#endif
