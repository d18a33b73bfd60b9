#!/usr/bin/env python3
"""Installs Intel MKL's shared libraries from PyPI into a project-local prefix, for the `mkl`
GEMM provider (sshsdp/kernels/gemm_provider.h loads libmkl_rt.so.2 from there at run time).

Only the Python standard library: the wheel is fetched through PyPI's simple index, checked against
the SHA-256 pinned here, and only the libraries an sgemm on the GNU OpenMP threading layer
needs are unpacked (about 370 MB unpacked from the 190 MB wheel). Idempotent: an existing install
of the pinned version is left alone.

  scripts/install_mkl.py                      # into ~/.cache/sshsdp/mkl-<version>/lib
  scripts/install_mkl.py --prefix /opt/mkl    # elsewhere (then SSHSDP_MKL_LIB=/opt/mkl/lib/...)
"""
import argparse
import hashlib
import html
import os
import pathlib
import re
import shutil
import sys
import tempfile
import urllib.request
import zipfile

VERSION = "2025.3.1"
WHEEL = f"mkl-{VERSION}-py2.py3-none-manylinux_2_28_x86_64.whl"
SHA256 = "db31e59fa368dd4fa45b494351f4b7e0e6204b08d7db27836118c4e1370eb011"
# mkl_rt picks the interface and threading layers and the CPU's kernels (def, mc3, avx2,
# avx512) by dlopen from its own directory.
LIBS = [
    "libmkl_rt.so.2", "libmkl_core.so.2", "libmkl_intel_lp64.so.2", "libmkl_gf_lp64.so.2",
    "libmkl_gnu_thread.so.2", "libmkl_sequential.so.2", "libmkl_def.so.2", "libmkl_mc3.so.2",
    "libmkl_avx2.so.2", "libmkl_avx512.so.2",
]


def default_prefix():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sshsdp", f"mkl-{VERSION}")


def wheel_url():
    """The wheel's address from PyPI's simple index (PEP 503), the one pip itself reads."""
    with urllib.request.urlopen("https://pypi.org/simple/mkl/", timeout=60) as r:
        index = r.read().decode()
    for href in re.findall(r'href="([^"]+)"', index):
        if href.split("#")[0].endswith("/" + WHEEL):
            return html.unescape(href.split("#")[0])
    sys.exit(f"install_mkl: PyPI's index lists no {WHEEL}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default=default_prefix())
    args = ap.parse_args()
    lib = pathlib.Path(args.prefix) / "lib"
    stamp = lib / ".installed"
    if stamp.exists() and stamp.read_text().strip() == SHA256:
        print(f"setup: MKL {VERSION} already in {lib}")
        return
    print(f"setup: downloading MKL {VERSION} from PyPI into {lib}")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / WHEEL
        h = hashlib.sha256()
        with urllib.request.urlopen(wheel_url(), timeout=600) as r, open(path, "wb") as out:
            while chunk := r.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != SHA256:
            sys.exit(f"install_mkl: {WHEEL} has SHA-256 {h.hexdigest()}, expected {SHA256}")
        staging = lib.with_name("lib.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with zipfile.ZipFile(path) as z:
            for name in LIBS:
                member = f"mkl-{VERSION}.data/data/lib/{name}"
                with z.open(member) as src, open(staging / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        (staging / ".installed").write_text(SHA256 + "\n")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
    print(f"setup: MKL {VERSION} installed in {lib}")


if __name__ == "__main__":
    main()
