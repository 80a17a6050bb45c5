"""The Python package spells a few TRELLIS_* names of its own; every one the C++ parts exchange
must be the one named in common/config/env_names.h (the configuration contract)."""
import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Read only by the Python package (not exchanged between the parts).
PYTHON_ONLY = {"TRELLIS_TORCH_REJOIN", "TRELLIS_TORCH_REJOIN_EXTRA_BYTES", "TRELLIS_BUILD_DIR"}


def test_every_name_the_python_package_reads_is_in_the_contract_header():
    with open(os.path.join(REPO, "common", "config", "env_names.h")) as f:
        contract = set(re.findall(r'inline constexpr char kEnv\w+\[\] = "(TRELLIS_\w+)";', f.read()))
    assert "TRELLIS_SCHEDULER" in contract
    package = os.path.join(REPO, "worker-lib", "python")
    used = set()
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    used |= set(re.findall(r'"(TRELLIS_[A-Z0-9_]+)"', f.read()))
    assert used, "no TRELLIS_* names found in the package"
    assert used - PYTHON_ONLY <= contract, sorted(used - PYTHON_ONLY - contract)
