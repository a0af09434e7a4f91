"""Stand-in for ansible-test's pip bootstrap script (get-pip.py).

ansible-test downloads get-pip.py from ci-files.testing.ansible.com, which the
build machines cannot reach. This script does the same job with what every
CPython has: ensurepip bootstraps the bundled pip, then pip installs the
packages ansible-test asked for (e.g. pip==24.2, setuptools, wheel) from PyPI.
tests/sanity.sh copies it to ~/.ansible/test/cache/get_pip_<version>.py.
"""

import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    if args and args[0] == "install":
        args = args[1:]
    saved = dict(os.environ)
    ensurepip.bootstrap(upgrade=True)
    # ensurepip points PIP_CONFIG_FILE at /dev/null for its own run; the
    # machine's pip configuration (certificates, index) must apply again.
    os.environ.clear()
    os.environ.update(saved)
    subprocess.check_call([sys.executable, "-m", "pip", "install", *args])


if __name__ == "__main__":
    main()
