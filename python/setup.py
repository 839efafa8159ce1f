"""Builds ps._ps, the C extension over libps.so, on CPython's stable ABI.

Where libps is looked for, first match wins:
  1. $PS_PREFIX: PREFIX/include/ps and PREFIX/lib (after `make install`);
  2. this source tree: ../worker/client, ../common and ../lib (after `make`);
  3. `pkg-config --cflags --libs ps`.
The library's folder is recorded as the extension's run path, so no
LD_LIBRARY_PATH is needed.
"""
import os
import shlex
import subprocess

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)


def find_libps():
    prefix = os.environ.get("PS_PREFIX")
    if prefix:
        return [os.path.join(prefix, "include", "ps")], [os.path.join(prefix, "lib")]
    if os.path.exists(os.path.join(TREE, "worker", "client", "ps_client.h")):
        lib = os.path.join(TREE, "lib")
        if not os.path.exists(os.path.join(lib, "libps.so")):
            raise SystemExit(f"libps: {lib}/libps.so is missing: run `make` in {TREE} first")
        return [os.path.join(TREE, "worker", "client"), os.path.join(TREE, "common")], [lib]
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "ps"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"libps: not found (set PS_PREFIX, or install ps.pc): {e}")
    flags = shlex.split(out)
    return [f[2:] for f in flags if f.startswith("-I")], [f[2:] for f in flags if f.startswith("-L")]


incs, libdirs = find_libps()
# Rebuilt whenever a header it reads changed, not only its .c files: the
# structs of ps_client.h (ps_shard_stats) are filled by libps.so, and an
# extension left compiled against an older layout writes past its buffers.
HEADERS = [os.path.join(d, h) for d in incs for h in ("ps_client.h", "ps_err.h")
           if os.path.exists(os.path.join(d, h))]
HEADERS += [os.path.join("src", f) for f in sorted(os.listdir(os.path.join(HERE, "src")))
            if f.endswith(".h")]
ext = Extension(
    "ps._ps",
    sources=[os.path.join("src", f) for f in ("pyps.c", "client.c", "arrays.c", "handle.c", "stats.c",
                                                      "declare.c", "unique.c")],
    depends=HEADERS,
    include_dirs=incs,
    library_dirs=libdirs,
    runtime_library_dirs=libdirs,
    libraries=["ps"],
    define_macros=[("Py_LIMITED_API", "0x030B0000")],
    py_limited_api=True,
    extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
)

setup(packages=["ps"], ext_modules=[ext], options={"bdist_wheel": {"py_limited_api": "cp311"}})
