"""GPU energy from NVML's cumulative counter (ctypes, no extra dependency); absent elsewhere.

The counter covers the whole device, so it counts both processes of the parallel baseline, and reading
it never touches JAX (the coordinator holds no device memory).
"""

import ctypes


class EnergyMeter:
    """`read()` -> joules consumed by GPU 0 since the driver loaded, or None without NVML."""

    def __init__(self):
        self._lib, self._handle = None, ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return
        if lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle)) == 0:
            self._lib = lib
            if self.read() is None:  # counter unsupported (pre-Volta): report no energy at all
                self._lib = None

    def read(self) -> float | None:
        if self._lib is None:
            return None
        millijoules = ctypes.c_ulonglong()
        if self._lib.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(millijoules)) != 0:
            return None
        return millijoules.value / 1e3
