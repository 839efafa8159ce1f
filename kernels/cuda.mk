# kernels/cuda.mk - builds the cuda compute backend (docs/architecture.md, Interfaces).
#
# Included by the top-level Makefile only when nvcc exists and kernels/*.cu
# exist; it sets CUDA_OBJS (objects linked into ps-worker and the tests in
# place of kernels/compute_cuda_stub.c) and CUDA_LIBS (their link flags).
#
#   kernels/*.cu  device kernels, one op per .cu/.cuh pair, built by nvcc
#   kernels/*.c   host side (the ops table, cuBLAS and cuDNN calls), built by
#                 $(CC) against the CUDA and cuDNN headers; compute_cpu.c and
#                 compute_cuda_stub.c, the other backends, are not part of it
#
# Overridable: CUDA_ARCH (the -gencode list), CUDNN_HOME (where cuDNN lives
# when it is not inside the CUDA toolkit), NVCCFLAGS.

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX that
# the driver can JIT for newer GPUs. Two real architectures keep the build
# short on small CI machines.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90

# cuDNN ships inside the toolkit here; elsewhere it is often a distro or
# tarball install. The first directory holding libcudnn.so wins.
CUDNN_HOME   ?=
CUDNN_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard \
                  $(if $(CUDNN_HOME),$(CUDNN_HOME)/lib64/libcudnn.so $(CUDNN_HOME)/lib/libcudnn.so) \
                  $(CUDA_HOME)/lib64/libcudnn.so $(CUDA_HOME)/lib/libcudnn.so \
                  /usr/lib/x86_64-linux-gnu/libcudnn.so /usr/local/lib/libcudnn.so))))
CUDNN_INCDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard \
                  $(if $(CUDNN_HOME),$(CUDNN_HOME)/include/cudnn.h) \
                  $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h \
                  /usr/include/x86_64-linux-gnu/cudnn.h /usr/local/include/cudnn.h))))

CUDA_INC  := $(addprefix -I,$(sort $(CUDA_HOME)/include $(CUDNN_INCDIR))) -Ikernels
NVCCFLAGS ?= -O2
# Kept apart from NVCCFLAGS so that overriding it on the command line keeps
# the architectures and warnings.
NVCC_BASE := -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra

CUDA_CU_OBJS := $(patsubst %.cu,$(OBJ)/%.o,$(wildcard kernels/*.cu))
# kernels/ also holds the cpu backend and the stub: not CUDA host code.
CUDA_C_SRCS  := $(filter-out kernels/compute_cpu.c kernels/compute_cuda_stub.c,$(wildcard kernels/*.c))
CUDA_C_OBJS  := $(patsubst %.c,$(OBJ)/%.o,$(CUDA_C_SRCS))
CUDA_OBJS    := $(CUDA_C_OBJS) $(CUDA_CU_OBJS)

# rpath so the binaries run without LD_LIBRARY_PATH; cuDNN's own runpath
# ($ORIGIN) finds its sub-libraries next to libcudnn.so. nvcc's host stubs
# use C++ static guards, hence libstdc++ when $(CC) links.
CUDA_LIBDIRS := $(sort $(CUDA_HOME)/lib64 $(CUDNN_LIBDIR))
CUDA_LIBS    := $(foreach d,$(CUDA_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) \
                -lcudnn -lcublas -lcudart -lstdc++

# Host-side C: the generic $(OBJ)/%.o rule, plus the CUDA include paths.
$(CUDA_C_OBJS): CPPFLAGS += $(CUDA_INC)

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
