"""`vllm serve` for the lab's CPU build, without the CLI's other subcommands.

vllm.entrypoints.cli.main imports every subcommand module before it parses; on an
AVX2-only CPU one of them loads the AVX512-BF16 kernel library before the CPU platform
picks the AVX2 one, and the process dies with SIGILL. This builds the real `serve`
subcommand (same parser, same validation, same dispatch: API server or --headless rank)
and nothing else. Installed by tests/setup.sh as /opt/vllm/bin/vllm-serve-lab in the lab
venv; used as vllm_service_native_command: [/opt/vllm/bin/python, /opt/vllm/bin/vllm-serve-lab].
"""

import ctypes
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
from vllm.logger import configure_logging_from_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def request_amx() -> None:
    """Ask the kernel for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).

    On a CPU with AMX, vLLM's CPU attention picks its AMX kernel for bf16 models; Linux
    gives a process the AMX tile state only after this request, and without it the first
    tile instruction raises SIGILL (seen here: the worker dies with exit -4 on the first
    request). The permission is inherited by the worker processes. A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(158, 0x1023, 18)  # SYS_arch_prctl (x86_64), ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        pass


def main() -> None:
    request_amx()
    cli_env_setup()
    parser = FlexibleArgumentParser(description="vllm serve (uma.vllm lab)")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    configure_logging_from_args(args)
    serve.validate(args)
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
