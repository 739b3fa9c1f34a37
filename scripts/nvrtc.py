"""Compiles CUDA C to PTX with NVRTC (NVIDIA's runtime compiler, from the
nvidia-cuda-nvrtc-cu12 wheel) through ctypes: no GPU, no CUDA toolkit, no host compiler.

usage: nvrtc.py SITE_PACKAGES SOURCE.cu ARCH OUT.ptx   (ARCH: 75, 80, 90)
"""

import ctypes
import glob
import os
import sys


def main():
    site, source, arch, out = sys.argv[1:5]
    found = glob.glob(os.path.join(site, "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"))
    if not found:
        sys.exit(f"no libnvrtc under {site}/nvidia/cuda_nvrtc/lib")
    nvrtc = ctypes.CDLL(found[0])
    program = ctypes.c_void_p()
    with open(source, "rb") as f:
        text = f.read()
    name = os.path.basename(source).encode()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), text, name, 0, None, None))
    includes = [
        os.path.dirname(os.path.abspath(source)),
        os.path.join(site, "nvidia/cuda_runtime/include"),
        os.path.join(site, "nvidia/cuda_nvcc/include"),
    ]
    options = [f"--gpu-architecture=compute_{arch}", "--std=c++17"]
    options += [f"-I{path}" for path in includes]
    encoded = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    result = nvrtc.nvrtcCompileProgram(program, len(options), encoded)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    if result != 0:
        sys.exit(f"{source} for sm_{arch} did not compile:\n{log.value.decode()}")
    nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetPTX(program, ptx))
    with open(out, "wb") as f:
        f.write(ptx.value)


def check(nvrtc, result):
    if result != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"nvrtc: {nvrtc.nvrtcGetErrorString(result).decode()}")


if __name__ == "__main__":
    main()
