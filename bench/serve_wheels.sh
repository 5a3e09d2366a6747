#!/usr/bin/env bash
# The wheels `splash serve` and `sglang.bench_serving` need on the H200 machine (Python 3.12, no
# network) beyond what its image holds (device docs' package list: aiohttp, anyio, click, h11,
# jinja2, prometheus-client, requests, transformers, pandas, pyarrow, pillow... are there).
# Run here, in the repository root; the lead carries .whl/ (bench/run_h200.sh installs it).
#
#   server: starlette, uvicorn (pure Python); pydantic 2.12 with its binary core (cp312), annotated-types,
#           typing-inspection (the request models; bench_serving imports pydantic too). Not typing-extensions:
#           the image has a newer one its packages need (a carried 4.15 broke an import in the server)
#   client: sglang 0.5.9 (pure Python, installed --no-deps), pybase64 (binary, cp312), ipython and
#           traitlets (pure Python; sglang's frontend imports IPython.display), datasets 4.4.2 with
#           dill and multiprocess (pure Python; bench_serving imports datasets at the top, and 4.4.2
#           accepts the image's huggingface-hub 1.x)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  starlette==1.10.0 uvicorn==0.54.0 sglang==0.5.9 pybase64==1.5.1 ipython==9.18.1 traitlets==5.16.1 \
  datasets==4.4.2 dill==0.4.0 multiprocess==0.70.18 \
  pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2
ls -la .whl/ && du -sh .whl/
