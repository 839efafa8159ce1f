/* transport_rdma.h - what the RDMA transport can tell before it is used. */
#ifndef PS_TRANSPORT_RDMA_H
#define PS_TRANSPORT_RDMA_H

#include <stddef.h>

/* Whether `transport: rdma` can run here with device (NULL or "" = any):
 * never 0 yet (the data path is not built), PS_ENOTSUP with one line in
 * why that names what is missing (kernel support, any device, the named
 * device; the devices found) and suggests tcp. */
int ps_rdma_probe(const char *device, char *why, size_t whylen);

#endif
