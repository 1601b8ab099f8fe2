"""Where kernels run, and how a unit's bytes get there: the copy stage.

On CPU the kernels use the weights where the reader put them, so the copy stage vanishes.
That is Demand Layering's two-stage, zero-copy pipeline (Section VI). With a discrete
accelerator the read buffer is host memory the kernels cannot use. A copy stage then
moves each unit into a device buffer: the paper's three-stage pipeline (Sections IV-V,
Algorithm 1). Three details come from the paper:

* the host buffer is pinned, so the copy engine can read it without blocking;
* copies run on their own stream and complete through events;
* a unit's device buffer is reused only after the kernels on it have finished.

``stages=3`` on CPU runs the same three-stage pipeline, with a real copy into a second
host buffer made by a real copy thread. It is the paper's architecture measured on a
machine without an accelerator, and it is how the copy-stage scheduling is tested
where there is no GPU.
"""

from __future__ import annotations

import torch

from layerfit.errors import LayerfitError


class Device:
    """Where kernels run. Also: whether a copy stage is needed, and how it copies."""

    name = "cpu"
    pins_host = False  # the host read buffer must be registered with the device driver

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.torch_device = torch.device("cpu")

    def device_buffer(self, capacity: int) -> torch.Tensor | None:
        """Storage for the device ring; None: an aligned host mapping (CPU)."""
        return None

    def pin(self, host: torch.Tensor) -> None:
        """Make the host read buffer usable for asynchronous copies."""

    def unpin(self, host: torch.Tensor) -> None:
        """Undo :meth:`pin` before the buffer is unmapped or reshaped."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy ``src`` (host) into ``dst`` (device buffer); return once the bytes are there."""
        dst.copy_(src)

    def finish_kernels(self) -> None:
        """Return once every kernel launched so far has finished (CPU: they have)."""

    def to_device(self, value: object) -> object:
        """``value`` on this device (tensors only; other values unchanged)."""
        return value.to(self.torch_device) if isinstance(value, torch.Tensor) else value


class CudaDevice(Device):
    """A CUDA device. Pinned host ring, copies on a copy stream, device ring.

    Every wait uses an event created with ``blocking=True``, so the waiting host thread
    sleeps in the driver instead of spinning.
    """

    name = "cuda"
    pins_host = True

    def __init__(self, stages: int, index: int | None = None) -> None:
        super().__init__(stages)
        self.torch_device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        self._copy_stream = torch.cuda.Stream(device=self.torch_device)

    def device_buffer(self, capacity: int) -> torch.Tensor:
        return torch.empty(capacity, dtype=torch.uint8, device=self.torch_device)

    def pin(self, host: torch.Tensor) -> None:
        rc = int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel(), 0))
        if rc != 0:
            raise LayerfitError(f"cannot pin the {host.numel()}-byte host read buffer (cudaError {rc})")

    def unpin(self, host: torch.Tensor) -> None:
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(self._copy_stream):
            dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event(blocking=True)
        done.record(self._copy_stream)
        done.synchronize()

    def finish_kernels(self) -> None:
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(self.torch_device))
        done.synchronize()


def device_stages(device: str, stages: int | None) -> int:
    """The pipeline stages ``stages`` means on ``device`` (2 on CPU, 3 on CUDA by default),
    checking both names without touching the device: what a plan needs to know of it."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise LayerfitError(f"unknown device {device!r}: choose cpu, cuda or cuda:N")
    if stages not in (None, 2, 3):
        raise LayerfitError(f"stages must be 2 (zero-copy) or 3 (read, copy, kernel), not {stages!r}")
    if kind == "cpu":
        return stages or 2
    if stages == 2:
        raise LayerfitError(
            "the two-stage zero-copy pipeline needs memory that CUDA kernels can use in "
            "place of host memory, which this engine does not set up: use stages=3 on cuda"
        )
    return 3


def get_device(device: str, stages: int | None) -> Device:
    """The device called ``device`` (``cpu``, ``cuda``, ``cuda:N``) with ``stages`` pipeline
    stages. The default is 2 on CPU (zero-copy) and 3 on CUDA."""
    n = device_stages(device, stages)
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return Device(n)
    if not torch.cuda.is_available():
        raise LayerfitError(
            f"device {device!r} was requested but this PyTorch sees no CUDA device "
            f"(torch {torch.__version__}): run on cpu"
        )
    return CudaDevice(n, int(index) if index else None)
