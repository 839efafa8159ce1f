# kernels/cuda.mk - builds the cuda compute backend as the plug-in
# lib/ps-compute-cuda.so (docs/architecture.md, Interfaces; docs/gpu.md).
#
# Included by the top-level Makefile when nvcc exists. If cuDNN is found
# too it sets CUDA_PLUGIN (the plug-in's path, a target of `make all`);
# otherwise it prints one line saying why and the build goes on without it.
# ps-worker opens the plug-in with dlopen when a config asks for cuda or
# auto, so no program links the CUDA libraries.
#
#   kernels/*.cu  device kernels, one op per .cu/.cuh pair, built by nvcc
#   kernels/*.c   host side (the ops table, cuBLAS and cuDNN calls), built by
#                 $(CC) against the CUDA and cuDNN headers; compute_ref.c
#                 and compute_dnnl*.c, the ref and cpu backends, are not part of it
#
# Overridable: CUDA_ARCH (the -gencode list), CUDNN_HOME (where cuDNN lives
# when it is not inside the toolkit: a tarball, or the nvidia-cudnn pip
# wheel's folder), NVCCFLAGS.

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX that
# the driver can JIT for newer GPUs. Two real architectures keep the build
# short on small CI machines.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90

# cuDNN ships inside the toolkit here; elsewhere it is a distro package, a
# tarball or a pip wheel (which has only libcudnn.so.9). The first
# directory holding the library wins.
CUDNN_HOME   ?=
CUDNN_LIB    := $(firstword $(wildcard \
                  $(foreach d,$(if $(CUDNN_HOME),$(CUDNN_HOME)/lib64 $(CUDNN_HOME)/lib) \
                    $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/lib/x86_64-linux-gnu /usr/local/lib, \
                    $(d)/libcudnn.so $(d)/libcudnn.so.9)))
CUDNN_LIBDIR := $(patsubst %/,%,$(dir $(CUDNN_LIB)))
CUDNN_INCDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard \
                  $(if $(CUDNN_HOME),$(CUDNN_HOME)/include/cudnn.h) \
                  $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h \
                  /usr/include/x86_64-linux-gnu/cudnn.h /usr/local/include/cudnn.h))))

ifeq ($(and $(CUDNN_LIB),$(CUDNN_INCDIR)),)
$(info cuda: nvcc found but not cuDNN ($(if $(CUDNN_INCDIR),libcudnn.so,cudnn.h) missing; set CUDNN_HOME): building without the CUDA plug-in)
CUDA_PLUGIN :=
else
CUDA_PLUGIN := lib/ps-compute-cuda.so

# cuDNN's folders first, so that CUDNN_HOME wins over a cuDNN inside the toolkit.
CUDA_INC  := -I$(CUDNN_INCDIR) $(addprefix -I,$(filter-out $(CUDNN_INCDIR),$(CUDA_HOME)/include)) -Ikernels
NVCCFLAGS ?= -O2
# Kept apart from NVCCFLAGS so that overriding it on the command line keeps
# the architectures and warnings. Position-independent (a shared object),
# and nothing exported but the ps_compute_plugin symbol.
NVCC_BASE := -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-fPIC,-fvisibility=hidden

CUDA_CU_OBJS := $(patsubst %.cu,$(OBJ)/%.o,$(wildcard kernels/*.cu))
# kernels/ also holds the cpu and ref backends: not CUDA host code.
CUDA_C_SRCS  := $(filter-out kernels/compute_ref.c kernels/compute_dnnl%.c kernels/embedding_bag_cpu.c,$(wildcard kernels/*.c))
CUDA_C_OBJS  := $(patsubst %.c,$(OBJ)/%.o,$(CUDA_C_SRCS))
CUDA_OBJS    := $(CUDA_C_OBJS) $(CUDA_CU_OBJS)

# rpath so the plug-in finds its libraries without LD_LIBRARY_PATH; cuDNN's
# own runpath ($ORIGIN) finds its sub-libraries next to libcudnn. nvcc's
# host stubs use C++ static guards, hence libstdc++.
CUDA_LIBDIRS := $(CUDNN_LIBDIR) $(filter-out $(CUDNN_LIBDIR),$(CUDA_HOME)/lib64)
CUDA_LIBS    := $(foreach d,$(CUDA_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) \
                $(if $(filter %.so,$(CUDNN_LIB)),-lcudnn,-l:libcudnn.so.9) \
                -lcublas -lcudart -lstdc++ -lm
# Every symbol resolved at link time (a sanitizer build leaves the
# sanitizer's own to the program that loads it).
CUDA_NODEFS  := $(if $(SANITIZE),,-Wl,--no-undefined)

# Host-side C: the generic $(OBJ)/%.o rule, plus the CUDA include paths.
$(CUDA_C_OBJS): CPPFLAGS += $(CUDA_INC)
$(CUDA_C_OBJS): CFLAGS += -fPIC -fvisibility=hidden

# nvcc's flags, recorded like $(OBJ)/.flags: changing them rebuilds the kernels.
$(OBJ)/.nvflags: FORCE
	@mkdir -p $(OBJ)
	@echo '$(NVCC) $(NVCCFLAGS) $(NVCC_BASE)' | cmp -s - $@ || \
		echo '$(NVCC) $(NVCCFLAGS) $(NVCC_BASE)' > $@

# Device code. The dependency file names the real object path (-MT), as the
# generic rule's -MMD does for C.
$(OBJ)/kernels/%.o: kernels/%.cu $(OBJ)/.flags $(OBJ)/.nvflags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_BASE) -Icommon -I$(GEN) $(CUDA_INC) -MMD -MP -MT $@ -MF $(@:.o=.d) -c $< -o $@

$(CUDA_PLUGIN): $(CUDA_OBJS) build/variant
	@mkdir -p lib
	$(CC) -shared $(LDFLAGS) $(CUDA_NODEFS) -o $@ $(CUDA_OBJS) $(CUDA_LIBS)
endif
