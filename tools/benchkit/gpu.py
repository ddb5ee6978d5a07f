"""GPU activity while the benchmark runs: a background sampler, summarised per time window.

Sources, first that works: NVML through `pynvml` (package nvidia-ml-py), else a long-running
`nvidia-smi --query-gpu=... -lms N` reader, else none (a CPU machine: every summary is None).
Each sample is (monotonic time, utilization.gpu %, utilization.memory %, power W, SM clock MHz, memory
used MiB: every process's allocations on the device, so the engine's footprint where it runs alone).
`utilization.gpu` is NVML's "a kernel was running" fraction, coarse by nature; where the GPU
supports GPM (Hopper does), `window_gpm()` also gives SM activity, SM occupancy, tensor-pipe and
DRAM-bandwidth utilization over an exact window from two GPM samples. Any NVML failure disables
only the part that failed; the benchmark never stops because of this module.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

Sample = tuple[float, float | None, float | None, float | None, float | None, float | None]
_SMI_FIELDS = "utilization.gpu,utilization.memory,power.draw,clocks.sm,memory.used"
_GPM_METRICS = {  # NVML_GPM_METRIC_* ids, also looked up by name when pynvml has them
    "sm_util": ("NVML_GPM_METRIC_SM_UTIL", 2),
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),
    "tensor_util": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
    "dram_bw_util": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10),
}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class GpuSampler:
    """Samples GPU `index` every `period_s` in a daemon thread from `start()` to `stop()`."""

    def __init__(self, index: int = 0, period_s: float = 0.25) -> None:
        self.index, self.period_s = index, period_s
        self.samples: list[Sample] = []
        self.source: str | None = None
        self.name: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._smi: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpm_ok = False

    def start(self) -> None:
        if self._open_nvml():
            self.source = "nvml"
            self._thread = threading.Thread(target=self._poll_nvml, name="gpu-sampler", daemon=True)
        elif self._open_smi():
            self.source = "nvidia-smi"
            self._thread = threading.Thread(target=self._read_smi, name="gpu-sampler", daemon=True)
        else:
            return
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._smi.wait(5)
        if self._thread is not None:
            self._thread.join(5)
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    # --- sources -------------------------------------------------------------------------------

    def _open_nvml(self) -> bool:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return False
        self._nvml = pynvml
        with contextlib.suppress(Exception):
            support = pynvml.nvmlGpmQueryDeviceSupport(self._handle)
            self._gpm_ok = bool(support.isSupportedDevice)
        return True

    def _poll_nvml(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.is_set():
            util = mem = power = clock = used = None
            with contextlib.suppress(Exception):
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                util, mem = float(rates.gpu), float(rates.memory)
            with contextlib.suppress(Exception):
                power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            with contextlib.suppress(Exception):
                clock = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                used = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            self.samples.append((time.monotonic(), util, mem, power, clock, used))
            self._stop.wait(self.period_s)

    def _open_smi(self) -> bool:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return False
        try:
            probe = subprocess.run(
                [smi, "-i", str(self.index), "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=15, check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return False
        self.name = probe.stdout.strip() or None
        period_ms = max(100, int(self.period_s * 1000))
        self._smi = subprocess.Popen(
            [smi, "-i", str(self.index), f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits",
             f"--loop-ms={period_ms}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        return True

    def _read_smi(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        for line in self._smi.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 5:
                values = [_float(p) for p in parts]
                self.samples.append((time.monotonic(), values[0], values[1], values[2], values[3], values[4]))

    # --- summaries -----------------------------------------------------------------------------

    def window(self, start: float, end: float) -> dict[str, Any] | None:
        """Means (and the utilization's max) of the samples taken in [start, end]; None without a GPU."""
        if self.source is None:
            return None
        inside = [s for s in list(self.samples) if start <= s[0] <= end]

        def mean(column: int) -> float | None:
            values = [s[column] for s in inside if s[column] is not None]
            return round(statistics.fmean(values), 2) if values else None

        utils = [s[1] for s in inside if s[1] is not None]
        used = [s[5] for s in inside if s[5] is not None]
        return {
            "source": self.source,
            "samples": len(inside),
            "util_mean": mean(1),
            "util_max": max(utils) if utils else None,
            "mem_util_mean": mean(2),
            "power_w_mean": mean(3),
            "sm_clock_mhz_mean": mean(4),
            "mem_used_mib_max": round(max(used)) if used else None,
        }

    def gpm_sample(self) -> Any:
        """An opaque GPM sample taken now (None where GPM is unavailable)."""
        if not self._gpm_ok:
            return None
        try:
            sample = self._nvml.nvmlGpmSampleAlloc()
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
            return sample
        except Exception:
            self._gpm_ok = False
            return None

    def window_gpm(self, first: Any, second: Any) -> dict[str, float | None] | None:
        """SM activity etc. (percent) between two `gpm_sample()`s; frees both samples."""
        if first is None or second is None:
            return None
        nvml = self._nvml
        out: dict[str, float | None] | None = None
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
            request.numMetrics = len(_GPM_METRICS)
            request.sample1, request.sample2 = first, second
            for slot, (const, fallback) in enumerate(_GPM_METRICS.values()):
                request.metrics[slot].metricId = getattr(nvml, const, fallback)
            nvml.nvmlGpmMetricsGet(request)
            out = {}
            for slot, key in enumerate(_GPM_METRICS):
                metric = request.metrics[slot]
                out[key] = round(float(metric.value), 2) if metric.nvmlReturn == 0 else None
        except Exception:
            self._gpm_ok = False
        finally:
            for sample in (first, second):
                with contextlib.suppress(Exception):
                    nvml.nvmlGpmSampleFree(sample)
        return out
