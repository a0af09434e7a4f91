"""Lab venv start-up hook (installed by tests/setup.sh with uma_lab_amx.pth): ask the kernel
for the AMX tile state in every Python process of the lab's vLLM venv.

On a CPU with AMX, vLLM 0.32's CPU attention picks its AMX kernel for bf16 models (block
size a multiple of 32, which its CPU backend requires). Linux gives a process the AMX tile
state only after arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); vLLM's workers are
started by exec and do not ask, so their first tile instruction raises SIGILL (measured in
the lab: the worker dies with exit -4 on the first request; the engine still answered
/health 200). A no-op on CPUs without AMX or on other architectures.
"""

import ctypes
import platform

if platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA
    except (OSError, AttributeError):
        pass
