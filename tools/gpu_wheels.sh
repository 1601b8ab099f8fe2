#!/usr/bin/env bash
# The wheels tools/gpu_session.sh carries to a lent CUDA machine (Python 3.12 there, no
# network): the serve, plan, tradeoff and schedule extras' packages and the test clients
# its image lacks, at the versions of requirements/test.lock. Run here, in the repo root,
# then call the device tool with carry [".whl"] (about 50 MB of the 64 MiB it carries).
set -eu
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
names="fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn orjson simpy
openai jiter sniffio tritonclient geventhttpclient gevent greenlet zope.event zope.interface python-rapidjson
brotli pymoo moocore autograd cma alive-progress about-time graphemeu deprecated cffi pycparser ortools
immutabledict protobuf"
pins=$(python3 - $names <<'PY'
import re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # PEP 503
lock = {norm(line.split("==")[0]): line.strip() for line in open("requirements/test.lock") if "==" in line}
missing = [n for n in sys.argv[1:] if norm(n) not in lock]
if missing:
    sys.exit(f"not in requirements/test.lock: {' '.join(missing)}")
print(" ".join(lock[norm(n)].split(";")[0].strip() for n in sys.argv[1:]))
PY
)
platforms=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64; do
  platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl $pins
du -sh .whl
