"""One ONNX Runtime session per component, run through IO binding (residency.md §6).

`ComponentSession.invoke` is the one seam every component run goes through: it checks the
inputs against the port contracts (a fresh invocation-scope symbol table), binds them where
they live, runs, adopts the outputs as `Value`s on the execution device, and checks those.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

try:
    import onnxruntime as ort
except ImportError:  # neither flavour installed: refused with a typed error at load
    ort = None

from speculant.errors import AdmissionError, ContractError, ResidencyError
from speculant.package.model import Ports
from speculant.session.contracts import SymbolTable
from speculant.tensors import HOST, TensorSeam, Value
from speculant.tensors.cuda_interop import keep_alive, ort_device, raw_binding

ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32",
    "tensor(int64)": "int64", "tensor(uint8)": "uint8", "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


def provider_for(device: str, seam: TensorSeam, *, use_tf32: bool) -> list:
    """The execution provider list for ``device`` ("host" or "cuda:N"); never a fallback."""
    if ort is None:
        raise ResidencyError(
            "ONNX Runtime is not installed", value=device,
            remedy="install one flavour: pip install 'speculant[cpu]' (onnxruntime) or "
            "pip install 'speculant[cuda]' (onnxruntime-gpu and CuPy)")
    available = ort.get_available_providers()
    if device == HOST:
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise ResidencyError(
            f"device '{device}' needs ONNX Runtime's CUDAExecutionProvider, but this onnxruntime "
            f"build offers only {available}", value=device,
            remedy="install the GPU build: pip install 'speculant[cuda]' (which installs "
            "onnxruntime-gpu instead of onnxruntime), or load with device='cpu'")
    if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia wheels, once
        ort.preload_dlls()
    backend = seam.device_backends["cuda"]
    ordinal = int(device.split(":")[1]) if ":" in device else 0
    options = {"device_id": str(ordinal), "use_tf32": "1" if use_tf32 else "0"}
    options.update(backend.provider_options(ordinal))
    return [("CUDAExecutionProvider", options)]


def _remedy_for(message: str, device: str) -> str:
    """What to do when ORT refuses a graph, where the cause is known."""
    if "GroupQueryAttention" in message and device != HOST:
        return ("ONNX Runtime's CUDA GroupQueryAttention takes float16 and bfloat16 only: a "
                "float32 package exported with graph 'fused' runs on the CPU; for CUDA rebuild "
                "it with `speculant convert PACKAGE OUT --dtype float16` (or --graph explicit)")
    return ""


class ComponentSession:
    """A component's ORT session, its port contracts and its execution device."""

    def __init__(self, name: str, source: str | bytes, ports: Ports, device: str,
                 seam: TensorSeam, *, use_tf32: bool = False, outputs_on_host: bool = False,
                 artifact: str = "", threads: int | None = None) -> None:
        """``threads``: ONNX Runtime's intra-op thread count (None: its default)."""
        self.name = name
        self.ports = ports
        self.device = device  # where the component executes
        # where its outputs are bound: the execution device, or the host when asked for
        self.output_residency = HOST if outputs_on_host else device
        self.seam = seam
        providers = provider_for(device, seam, use_tf32=use_tf32)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads is not None:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(source, options, providers=providers)
        except Exception as exc:  # ORT raises its own exception types; wrap them (A9)
            raise AdmissionError(
                f"ONNX Runtime refused to create the session of component '{name}': {exc}",
                file=artifact, path=f"pipeline.workflow.components.{name}",
                remedy=_remedy_for(str(exc), device)) from exc
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if self.session.get_providers()[0] != wanted:
            raise ResidencyError(
                f"component '{name}' asked for {wanted} but ONNX Runtime created "
                f"{self.session.get_providers()}", value=device,
                remedy="check the CUDA and cuDNN libraries (onnxruntime.preload_dlls()), or "
                "load with device='cpu'")
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.output_dtypes = {o.name: ORT_TYPES.get(o.type, o.type)
                              for o in self.session.get_outputs()}
        self.num_invocations = 0

    @property
    def provider_options(self) -> dict:
        return self.session.get_provider_options()

    def invoke(self, inputs: Mapping[str, Value], outputs: list[str] | None = None
               ) -> dict[str, Value]:
        """Run the component on ``inputs`` (port -> Value); return the requested outputs."""
        symbols = SymbolTable(f"invocation of component '{self.name}'")
        for port, value in inputs.items():
            contract = self.ports.inputs.get(port)
            if contract is None:
                raise ContractError(f"component '{self.name}' has no input port '{port}'",
                                    path=port)
            symbols.check(port, contract, value)
        wanted = outputs or [p for p in self.ports.outputs if p in self.output_names]
        binding = self.bind(inputs, wanted)
        # ORT's run waits for the device before it returns. Skipping that wait (run config
        # "disable_synchronize_execution_providers") would let the host prepare the next step
        # while the device computes, but onnxruntime-gpu 1.31.1 then aborts the process when
        # it frees the pinned staging memory of host-bound inputs ("cudaFreeHost: operation
        # not permitted", seen on the H200); so every run keeps ORT's default.
        self._run_bound(binding)
        self.num_invocations += 1
        # the C-level OrtValues (the Python wrapper would re-wrap each one)
        produced = dict(zip(wanted, raw_binding(binding).get_outputs(), strict=True))
        result = {port: self._adopt_output(port, ort_value) for port, ort_value in
                  produced.items()}
        for port, value in result.items():
            symbols.check(port, self.ports.outputs[port], value)
        return result

    def _run_bound(self, binding: ort.IOBinding) -> None:
        """ORT's run on ``binding``: the C-level call where this build has it (the Python
        wrapper adds per-run checks for graph capture, which speculant does not use)."""
        raw_session = getattr(self.session, "_sess", None)
        if raw_session is None or raw_binding(binding) is binding:
            self.session.run_with_iobinding(binding)
        else:
            raw_session.run_with_iobinding(raw_binding(binding), None)

    # -- binding --------------------------------------------------------------------------
    def bind(self, inputs: Mapping[str, Value], outputs: list[str]) -> ort.IOBinding:
        """An IO binding of ``inputs`` where they live and ``outputs`` to the output
        residency (unchecked: :meth:`invoke` checks the contracts first)."""
        binding = self.session.io_binding()
        for port, value in inputs.items():
            self._bind_input(binding, port, value)
        for port in outputs:
            self._bind_output(binding, port)
        return binding

    def _bind_input(self, binding: ort.IOBinding, port: str, value: Value) -> None:
        if value.residency == HOST:  # ORT uploads it: an upload, not a read
            raw_binding(binding).bind_input(port, value.data)
            keep_alive(binding, port, value)  # ORT reads the array's memory at each run
            return
        if value.residency != self.device:
            raise ResidencyError(
                f"input '{port}' of component '{self.name}' is {value.describe()}, but the "
                f"component executes on {self.device}",
                remedy=f"adopt the value into {self.device} first, or run the component on "
                f"{value.residency}")
        self.seam.device_backends["cuda"].bind_input(binding, port, value)

    def _bind_output(self, binding: ort.IOBinding, port: str) -> None:
        if self.output_residency == HOST:
            raw_binding(binding).bind_output(port, ort_device("cpu", 0))
        else:
            self.seam.device_backends["cuda"].bind_output(binding, port, self.device)

    def _adopt_output(self, port: str, ort_value: ort.OrtValue) -> Value:
        dtype = self.output_dtypes[port]
        if self.output_residency == HOST:
            array = np.ascontiguousarray(ort_value.numpy())  # host memory already: no crossing
            return Value(array, HOST, dtype, owner=ort_value, owned=False)
        return self.seam.device_backends["cuda"].wrap_output(ort_value, dtype, self.device)
