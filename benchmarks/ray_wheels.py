"""Wheels for `sweep --executor ray` on a machine that cannot download
(the H200 image: CPython 3.12, manylinux x86_64, which already has click,
filelock, msgpack, packaging, protobuf, pyyaml and requests, but neither
Ray nor jsonschema).

    python benchmarks/ray_wheels.py .carry/ray-wheels
    # there: python3 -m pip install --no-index --no-deps --target /tmp/site .carry/ray-wheels/*.whl

Downloads (no dependencies resolved: the list is what that image lacks)
and rewrites Ray's wheel without its Java jar and the dashboard's source
map (31 of its 79 MB: Java workers and dashboard debugging are never used
by a sweep), so that the folder fits a 64 MiB transfer. The rewritten
wheel's RECORD lists exactly the files it holds.
"""

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

WHEELS = ["ray==2.60.0", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py"]
PLATFORM = ["--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--implementation", "cp",
            "--abi", "cp312", "--only-binary=:all:", "--no-deps"]
DROPPED = ("ray/jars/", ".js.map")


def dropped(name: str) -> bool:
    return name.startswith(DROPPED[0]) or name.endswith(DROPPED[1])


def strip(wheel: Path):
    """Rewrite `wheel` in place without the DROPPED files (and their RECORD lines)."""
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if dropped(info.filename):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not dropped(line.split(",")[0])).encode()
            dst.writestr(info, data)
    slim.replace(wheel)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder for the wheels")
    args = p.parse_args()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(args.out), *PLATFORM, *WHEELS],
                   check=True)
    for wheel in args.out.glob("ray-*.whl"):
        strip(wheel)
    for wheel in sorted(args.out.glob("*.whl")):
        print(f"{wheel.stat().st_size / 2**20:7.1f} MiB  {wheel.name}")


if __name__ == "__main__":
    main()
