import os

import pytest, torch

# A CPU's decode steps run eagerly in the tests, as `make test` asks (nbs/11b_cpu.ipynb): compiling each small engine's
# graphs would take longer than the test. tests/test_cpu_compile.py clears it to check the compiled path.
os.environ.setdefault("LITELLAMA_CPU_COMPILE", "0")

def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords: item.add_marker(skip)
