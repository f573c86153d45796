"""scripts/install_llama.py chooses CUDA or the CPU from what the machine has, says why, and falls back
(with scripts/llama_build/: cuda.py, the detection, and wheel.py, the build steps).

Detection runs over a fake environment: nvidia-smi's and nvcc's output from a table, toolkits as
folders under tmp_path, no GPU needed. Building, installing and the GPU check are fakes too.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
from pathlib import Path

from tests.support.scripts import load

install = load("install_llama")
cuda_toolkit = load("llama_build.cuda")
llama_wheel = load("llama_build.wheel")

ZEN3 = "flags\t\t: fpu sse4_2 f16c fma bmi2 avx avx2\n"
ZEN3_ARGS = (  # today's CPU flags for this CPU: the cached wheels are keyed by exactly these
    "-DGGML_NATIVE=OFF -DGGML_RPC=ON -DGGML_SSE42=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_BMI2=ON "
    "-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF "
    "-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
    "-DGGML_AMX_BF16=OFF"
).split()
ARCHS_12 = " ".join(f"compute_{a}" for a in (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90))
ARCHS_13 = " ".join(f"compute_{a}" for a in (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121))
SMI = """Fri Nov 28 12:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
"""
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
             "the latest NVIDIA driver is installed and running.")


class Machine:
    """A fake machine: its NVIDIA driver (if any), its GPUs, its nvcc installs."""

    def __init__(self, tmp_path: Path, driver: str | None = None, cuda: str = "", gpus=(),
                 smi_error: str = "", proc: str | None = None):
        self.tmp, self.driver, self.cuda, self.gpus = tmp_path, driver, cuda, gpus
        self.smi_error, self.proc = smi_error, proc
        self.nvccs: dict[str, tuple[str, Path]] = {}  # path → (version, toolkit root)
        self.on_path: str | None = None
        self.ldconfig = "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
        self.ran: list[list[str]] = []

    def toolkit(self, version: str, cublas: bool = True, on_path: bool = True, name: str = "") -> Path:
        """A CUDA toolkit folder as NVIDIA's installer lays it out (only the files detection looks at)."""
        root = self.tmp / (name or f"cuda-{version}")
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "nvcc").write_text("")
        lib = root / "targets" / "x86_64-linux" / "lib"
        lib.mkdir(parents=True)
        (root / "lib64").symlink_to(lib)
        (root / "include").mkdir()
        (lib / f"libcudart.so.{version.split('.')[0]}").write_text("")
        if cublas:
            (lib / f"libcublas.so.{version.split('.')[0]}").write_text("")
            (root / "include" / "cublas_v2.h").write_text("")
        nvcc = str(root / "bin" / "nvcc")
        self.nvccs[nvcc] = (version, root)
        if on_path:
            self.on_path = nvcc
        return root

    def run(self, cmd: list[str]) -> str:
        self.ran.append(cmd)
        if cmd[0] == "nvidia-smi":
            if self.smi_error:
                raise cuda_toolkit.CommandFailed(self.smi_error)
            if len(cmd) == 1:
                return SMI.format(driver=self.driver, cuda=self.cuda)
            return "".join(f"{name}, {cap}, {self.driver}\n" for name, cap in self.gpus)
        if cmd[0] == "ldconfig":
            return self.ldconfig
        if cmd[0] in self.nvccs:
            version, root = self.nvccs[cmd[0]]
            if cmd[1] == "--version":
                return f"Cuda compilation tools, release {version}, V{version}.1\n"
            if cmd[1] == "--list-gpu-arch":
                return ARCHS_13 if version.startswith("13") else ARCHS_12
            if cmd[1] == "-dryrun":
                return f"#$ _HERE_={root}/bin\n#$ TOP={root}/bin/..\n"
        raise cuda_toolkit.CommandFailed(f"{cmd[0]}: not found")

    def which(self, name: str) -> str | None:
        if name == "nvidia-smi":
            return "/usr/bin/nvidia-smi" if self.driver or self.smi_error else None
        return self.on_path if name == "nvcc" else None

    def read(self, path: str) -> str | None:
        return self.proc if path == cuda_toolkit.PROC_VERSION else None

    def env(self, **environ: str):
        return cuda_toolkit.Env(run=self.run, which=self.which, read=self.read, environ=environ,
                                machine="x86_64", cache=self.tmp / "cache", cpuinfo=ZEN3, nvcc_places=())


def opts(*argv: str) -> argparse.Namespace:
    return argparse.Namespace(cpu="--cpu" in argv, portable="--portable" in argv)


def choose(machine: Machine, *argv: str, **environ: str):
    return install.choose(opts(*argv), machine.env(**environ))


def h200(tmp_path: Path, cuda: str = "13.0", driver: str = "580.65.06") -> Machine:
    return Machine(tmp_path, driver, cuda, [("NVIDIA H200", "9.0")])


def rtx4090(tmp_path: Path, cuda: str = "12.4") -> Machine:
    return Machine(tmp_path, "550.54.15", cuda, [("NVIDIA GeForce RTX 4090", "8.9")])


def flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("-D"))


# --- the choice -------------------------------------------------------------------------------------


def test_no_driver_builds_for_the_cpu_with_todays_flags_and_cache_key(tmp_path):
    choice = choose(Machine(tmp_path))
    assert choice.line == "CPU build: no NVIDIA driver found"
    assert not choice.cuda
    assert choice.args == ZEN3_ARGS == install.cmake_args({"sse4_2", "f16c", "fma", "bmi2", "avx", "avx2"})
    # the key of a CPU build is what it was before CUDA detection: existing cached wheels stay valid
    ident = " ".join([llama_wheel.LLAMA_CPP_PYTHON, platform.machine(), sys.implementation.cache_tag,
                      *ZEN3_ARGS])
    assert llama_wheel.build_key(choice.key_args) == hashlib.sha256(ident.encode()).hexdigest()[:16]


def test_driver_and_system_nvcc_build_cuda_for_this_gpu(tmp_path):
    machine = rtx4090(tmp_path)
    root = machine.toolkit("12.4")
    choice = choose(machine)
    nvcc = root / "bin" / "nvcc"
    assert choice.line == (f"CUDA 12.4 build for sm_89 (NVIDIA GeForce RTX 4090, driver 550.54.15, "
                           f"nvcc 12.4 at {nvcc})")
    assert choice.args[: len(ZEN3_ARGS)] == ZEN3_ARGS  # this CPU's flags, AMX off, as for a CPU build
    assert choice.args[len(ZEN3_ARGS):] == [
        "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89", f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DCUDAToolkit_ROOT={root}", f"-DCMAKE_SHARED_LINKER_FLAGS_INIT=-Wl,-rpath,{root / 'lib64'}"]
    assert choice.toolkit.wheels == ()


def test_several_gpus_build_for_each_architecture_once(tmp_path):
    h100 = ("NVIDIA H100 80GB HBM3", "9.0")
    machine = Machine(tmp_path, "575.57.08", "12.9", [("NVIDIA RTX A6000", "8.6"), h100, h100])
    machine.toolkit("12.9")
    choice = choose(machine)
    assert flags(choice.args)["CMAKE_CUDA_ARCHITECTURES"] == "86;90"
    assert choice.line.startswith("CUDA 12.9 build for sm_86+sm_90 (3 GPUs: NVIDIA H100 80GB HBM3, "
                                  "NVIDIA RTX A6000, driver 575.57.08, nvcc 12.9 at ")


def test_driver_without_nvcc_takes_pypi_toolkit_of_the_drivers_cuda_version(tmp_path):
    choice = choose(h200(tmp_path, cuda="13.0"))
    toolkit = choice.toolkit
    assert toolkit.wheels == tuple(f"{name}>=13.0,<13.1" for name in (
        "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cublas",
        "nvidia-cuda-cccl"))
    root = tmp_path / "cache" / "cuda" / "13.0" / "nvidia" / "cu13"
    assert toolkit.root == str(root) and toolkit.nvcc == str(root / "bin" / "nvcc")
    assert choice.line == ("CUDA 13.0 build for sm_90 (NVIDIA H200, driver 580.65.06, nvcc from PyPI's "
                           "nvidia-cuda-nvcc 13.0 wheels; no nvcc found (CUDACXX, CUDA_HOME, PATH, "
                           "/usr/local/cuda))")
    assert flags(choice.args)["CMAKE_CUDA_COMPILER"] == str(root / "bin" / "nvcc")
    # never newer than the driver: a driver for CUDA 13.2 gets the newest 13.2 toolkit at most
    assert choose(h200(tmp_path, cuda="13.2")).toolkit.wheels[0] == "nvidia-cuda-nvcc>=13.0,<13.3"


def test_cuda12_driver_without_nvcc_builds_for_the_cpu_and_says_what_to_install(tmp_path):
    choice = choose(rtx4090(tmp_path))
    assert not choice.cuda and choice.args == ZEN3_ARGS
    assert choice.line == (
        "CPU build: NVIDIA driver 550.54.15 (CUDA 12.4) but no CUDA compiler to use: no nvcc found "
        "(CUDACXX, CUDA_HOME, PATH, /usr/local/cuda); PyPI has no nvcc for CUDA 12 (only CUDA 13's "
        "packages carry one). Install a CUDA 12.x toolkit (nvcc and cuBLAS, at most 12.4) or a driver for "
        "CUDA 13 (580+), then rerun")


def test_too_old_driver_says_so(tmp_path):
    machine = Machine(tmp_path, "470.256.02", "11.4", [("Tesla T4", "7.5")])
    machine.toolkit("11.4")
    choice = choose(machine)
    assert not choice.cuda
    assert choice.line == ("CPU build: the NVIDIA driver 470.256.02 runs CUDA 11.4 at most; llama.cpp's "
                           "CUDA build needs CUDA 12.0 or newer (driver 525+): update the driver and rerun")


def test_nvcc_newer_than_the_driver_is_not_used(tmp_path):
    machine = rtx4090(tmp_path, cuda="12.4")
    machine.toolkit("13.0")
    choice = choose(machine)
    assert not choice.cuda
    assert ("the system's nvcc 13.0 is newer than the driver's CUDA 12.4: what it builds would not load"
            in choice.line)
    # a CUDA 13 driver with the same nvcc uses it
    machine = h200(tmp_path / "b", cuda="13.1")
    machine.tmp.mkdir()
    machine.toolkit("13.0")
    assert choose(machine).line.startswith("CUDA 13.0 build for sm_90 (NVIDIA H200, driver 580.65.06, "
                                           "nvcc 13.0 at ")


def test_older_nvcc_of_an_older_major_is_used(tmp_path):
    machine = h200(tmp_path, cuda="13.0")
    machine.toolkit("12.6")
    choice = choose(machine)
    assert choice.line.startswith("CUDA 12.6 build for sm_90 ") and choice.toolkit.wheels == ()


def test_nvcc_without_cublas_gives_way_to_the_pypi_toolkit(tmp_path):
    machine = h200(tmp_path)
    root = machine.toolkit("13.0", cublas=False)
    choice = choose(machine)
    assert choice.toolkit.wheels and choice.line.endswith(
        f"nvcc from PyPI's nvidia-cuda-nvcc 13.0 wheels; the system's nvcc 13.0 has no cuBLAS beside it "
        f"({root}))")


def test_nvcc_that_does_not_know_the_gpu_is_not_used(tmp_path):
    machine = Machine(tmp_path, "570.86.10", "12.8", [("NVIDIA GeForce RTX 5090", "12.0")])
    machine.toolkit("12.4")
    choice = choose(machine)
    assert not choice.cuda and "the system's nvcc 12.4 cannot compile for sm_120" in choice.line


def test_nvcc_found_through_cuda_home_when_not_on_path(tmp_path):
    machine = rtx4090(tmp_path)
    root = machine.toolkit("12.4", on_path=False)
    assert not choose(machine).cuda
    assert choose(machine, CUDA_HOME=str(root)).toolkit.nvcc == str(root / "bin" / "nvcc")


def test_old_gpu_on_a_cuda13_driver_needs_a_cuda12_toolkit(tmp_path):
    choice = choose(Machine(tmp_path, "580.65.06", "13.0", [("Tesla P100-PCIE-16GB", "6.0")]))
    assert not choice.cuda
    assert "CUDA 13, the toolkit PyPI has, no longer compiles for sm_60" in choice.line
    assert "Install a CUDA 13.x toolkit" in choice.line  # as the driver's version; the line says what failed


def test_cpu_and_portable_opt_out(tmp_path):
    machine = h200(tmp_path)
    machine.toolkit("13.0")
    assert choose(machine).cuda
    machine.ran.clear()
    cpu = choose(machine, "--cpu")
    assert (cpu.line, cpu.args, cpu.toolkit) == ("CPU build: --cpu given", ZEN3_ARGS, None)
    portable = choose(machine, "--portable")
    assert portable.line == "CPU build: --portable builds the CPU-only wheel a shipped binary needs"
    assert not portable.cuda and portable.args == install.cmake_args(None)
    assert machine.ran == []  # neither asks the driver


def test_users_cuda_cmake_args_are_kept_as_before(tmp_path):
    machine = h200(tmp_path)
    choice = choose(machine, CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=80")
    assert choice.args == [*ZEN3_ARGS, "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=80"] == choice.key_args
    assert "no GPU detection" in choice.line and not machine.ran
    # other flags of the user's still come last, after the detected CUDA ones
    machine.toolkit("13.0")
    assert choose(machine, CMAKE_ARGS="-DGGML_CUDA_FA=OFF").args[-1] == "-DGGML_CUDA_FA=OFF"


def test_a_driver_that_nvidia_smi_cannot_reach(tmp_path):
    choice = choose(Machine(tmp_path, smi_error=NO_DRIVER))
    assert not choice.cuda
    assert choice.line == f"CPU build: nvidia-smi failed ({NO_DRIVER})"
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    choice = choose(Machine(tmp_path, proc=proc))
    assert choice.line.startswith("CPU build: the NVIDIA driver 550.54.15 is loaded "
                                  "(/proc/driver/nvidia/version) but nvidia-smi is not on PATH")


def test_parsers():
    assert cuda_toolkit.parse_smi(SMI.format(driver="550.54.15", cuda="12.4")) == ("550.54.15", (12, 4))
    assert cuda_toolkit.parse_smi("garbage") == (None, None)
    assert cuda_toolkit.parse_gpus("NVIDIA H200, 9.0, 580.65.06\nNVIDIA GeForce RTX 5090, 12.0, 580.65.06\n"
                              "Quadro K2200, [N/A], 470.1\n") == (
        cuda_toolkit.Gpu("NVIDIA H200", "90"), cuda_toolkit.Gpu("NVIDIA GeForce RTX 5090", "120"))
    assert cuda_toolkit.parse_nvcc_version("Cuda compilation tools, release 12.4, V12.4.131") == (12, 4)
    assert cuda_toolkit.parse_nvcc_version("nvcc: command not found") is None


def test_cache_keys_differ_per_choice_and_not_per_toolkit_path(tmp_path):
    keys = {}
    keys["cpu"] = choose(Machine(tmp_path / "a")).key_args
    cases = {"12.4 sm_89": ("12.4", "8.9"), "12.6 sm_89": ("12.6", "8.9"), "12.4 sm_86": ("12.4", "8.6")}
    for name, (cuda, gpu) in cases.items():
        machine = Machine(tmp_path / name, "560.35.03", cuda, [("GPU", gpu)])
        machine.tmp.mkdir()
        machine.toolkit(cuda)
        keys[name] = choose(machine).key_args
    keys["wheels 13.0 sm_90"] = choose(h200(tmp_path / "b")).key_args
    hashed = {llama_wheel.build_key(k) for k in keys.values()}
    assert len(hashed) == len(keys)
    cuda = keys["12.4 sm_89"][len(ZEN3_ARGS):]
    assert cuda == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89", "cuda=12.4"]  # no paths
    # the same toolkit version installed elsewhere builds the same wheel
    machine = rtx4090(tmp_path / "c")
    machine.tmp.mkdir()
    machine.toolkit("12.4", name="somewhere-else")
    assert choose(machine).key_args == keys["12.4 sm_89"]


# --- building and falling back ------------------------------------------------------------------------


class Steps:
    """Fake build/install/check/fetch that record what they were asked to do."""

    def __init__(self, machine: Machine, fail_cuda: str = "", gpu_check: str = ""):
        self.machine, self.fail_cuda, self.gpu_check = machine, fail_cuda, gpu_check
        self.built: list[list[str]] = []
        self.installed: list[Path] = []
        self.fetched: list[list[str]] = []

    def build(self, args: list[str], out: Path) -> Path:
        self.built.append(args)
        if self.fail_cuda and "-DGGML_CUDA=on" in args:
            tail = ["CMake Error at ggml-cuda/CMakeLists.txt:16", self.fail_cuda]
            raise llama_wheel.StepFailed("pip wheel exited with 1", tail, out / "build.log")
        out.mkdir(parents=True, exist_ok=True)
        wheel = out / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
        wheel.write_text(" ".join(args))
        return wheel

    def install(self, wheel: Path) -> None:
        self.installed.append(wheel)

    def check(self) -> str:
        return self.gpu_check

    def fetch(self, requirements: list[str], target: Path) -> None:
        """What `pip install --target` of CUDA 13's wheels lays out (the parts that matter here)."""
        self.fetched.append(requirements)
        root = target / "nvidia" / "cu13"
        for sub in ("bin", "lib", "include"):
            (root / sub).mkdir(parents=True)
        (root / "bin" / "nvcc").write_text("")
        for lib in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
            (root / "lib" / lib).write_text("")
        (root / "include" / "cublas_v2.h").write_text("")
        self.machine.nvccs[str(root / "bin" / "nvcc")] = ("13.0", root)

    def steps(self):
        return llama_wheel.Steps(build=self.build, install=self.install, check=self.check,
                             fetch_toolkit=self.fetch)


def main(machine: Machine, steps: Steps, *argv: str) -> int:
    return install.main(list(argv), env=machine.env(), steps=steps.steps())


def test_cuda_build_installed_and_then_reused(tmp_path, capsys):
    machine = rtx4090(tmp_path)
    machine.toolkit("12.4")
    steps = Steps(machine)
    assert main(machine, steps) == 0
    assert len(steps.built) == 1 and "-DGGML_CUDA=on" in steps.built[0] and len(steps.installed) == 1
    out = capsys.readouterr().out
    assert out.startswith("CUDA 12.4 build for sm_89 (NVIDIA GeForce RTX 4090, driver 550.54.15, "
                          "nvcc 12.4 at ")
    assert main(machine, steps) == 0
    assert len(steps.built) == 1 and steps.installed == [steps.installed[0]] * 2
    assert "using the cached llama-cpp-python wheel" in capsys.readouterr().out


def test_failing_cuda_build_falls_back_to_the_cpu_build_and_says_why(tmp_path, capsys):
    machine = rtx4090(tmp_path)
    machine.toolkit("12.4")
    steps = Steps(machine, fail_cuda="nvcc fatal : Unsupported gpu architecture 'compute_89'")
    assert main(machine, steps) == 0
    assert [("-DGGML_CUDA=on" in args) for args in steps.built] == [True, False]
    assert steps.built[1] == ZEN3_ARGS  # the CPU build, exactly as without a GPU
    assert len(steps.installed) == 1 and steps.installed[0].read_text() == " ".join(ZEN3_ARGS)
    out = capsys.readouterr().out
    assert "the CUDA build failed: pip wheel exited with 1" in out
    assert "  nvcc fatal : Unsupported gpu architecture 'compute_89'" in out  # the log's last lines
    assert "build.log" in out
    assert "falling back to the CPU build. Rerun `python scripts/install_llama.py` to try CUDA again" in out
    assert "--cpu to stop trying" in out
    assert out.rstrip().splitlines()[-1] == "CPU build: the CUDA build failed (above)"


def test_cuda_build_that_cannot_see_the_gpu_falls_back_too(tmp_path, capsys):
    machine = rtx4090(tmp_path)
    machine.toolkit("12.4")
    steps = Steps(machine, gpu_check="the CUDA build installed, but llama.cpp finds no GPU through it")
    assert main(machine, steps) == 0
    assert len(steps.installed) == 2 and steps.installed[-1].read_text() == " ".join(ZEN3_ARGS)
    out = capsys.readouterr().out
    assert "the CUDA build failed: the CUDA build installed, but llama.cpp finds no GPU" in out


def test_pypi_toolkit_installed_once_into_the_cache_and_completed(tmp_path, capsys):
    machine = h200(tmp_path)
    steps = Steps(machine)
    assert main(machine, steps, "--no-install") == 0
    assert steps.fetched == [list(choose(machine).toolkit.wheels)]
    root = tmp_path / "cache" / "cuda" / "13.0" / "nvidia" / "cu13"
    assert (root.parent.parent / "READY").read_text().startswith("Cuda compilation tools, release 13.0")
    # what CMake's FindCUDAToolkit and the linker look for, as in an installed toolkit
    assert os.readlink(root / "lib64") == "lib"
    assert (root / "targets" / "x86_64-linux" / "lib" / "libcublas.so.13").is_file()
    assert os.readlink(root / "lib" / "libcudart.so") == "libcudart.so.13"
    assert os.readlink(root / "lib" / "stubs" / "libcuda.so") == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert flags(steps.built[0])["CMAKE_SHARED_LINKER_FLAGS_INIT"] == f"-Wl,-rpath,{root / 'lib'}"
    assert "installing the CUDA toolkit from PyPI" in capsys.readouterr().out
    assert main(machine, steps, "--no-install", "--rebuild") == 0
    assert len(steps.fetched) == 1 and len(steps.built) == 2  # the toolkit is reused, the wheel rebuilt


def test_failing_toolkit_install_falls_back(tmp_path, capsys):
    machine = h200(tmp_path)
    steps = Steps(machine)

    def offline(requirements, target):
        raise OSError("no network")

    steps.fetch = offline
    assert main(machine, steps) == 0
    assert steps.built == [ZEN3_ARGS]
    out = capsys.readouterr().out
    assert "the CUDA build failed: installing the CUDA toolkit wheels failed (no network)" in out


def test_dry_run_says_what_and_builds_nothing(tmp_path, capsys):
    machine = h200(tmp_path)

    class Nothing:
        def __getattr__(self, name):
            raise AssertionError(f"dry run called {name}")

    assert install.main(["--dry-run"], env=machine.env(), steps=Nothing()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CUDA 13.0 build for sm_90 (NVIDIA H200")
    assert out[1].startswith("CMAKE_ARGS: -DGGML_NATIVE=OFF ") and "-DGGML_CUDA=on" in out[1]
    assert out[2].startswith("toolkit: pip install --target ") and "'nvidia-cuda-nvcc>=13.0,<13.1'" in out[2]
    assert out[3].startswith(f"wheel cache: {tmp_path / 'cache' / 'llama-wheels'}/")
    assert out[3].endswith("(not built yet)")
    assert not (tmp_path / "cache").exists()
    install.main(["--print-args", "--cpu"], env=machine.env(), steps=Nothing())
    assert capsys.readouterr().out == " ".join(ZEN3_ARGS) + "\n"


def test_error_tail_stops_before_pips_closing_notes():
    log = "\n".join([*(f"line {i}" for i in range(30)), "  nvcc fatal : boom", "  error: subprocess-exited",
                     "note: This error originates from a subprocess, and is likely not a problem with pip.",
                     "ERROR: Failed to build 'llama-cpp-python'"])
    tail = llama_wheel.error_tail(log, lines=3)
    assert tail == ["line 29", "  nvcc fatal : boom", "  error: subprocess-exited"]
    indented = "Collecting llama-cpp-python\n" + "\n".join(f"      {line}" for line in log.splitlines()[:-2])
    assert llama_wheel.error_tail(indented, lines=3) == tail  # pip's indent taken off


def test_other_cpus_keep_their_plain_args(tmp_path):
    env = Machine(tmp_path).env()._replace(machine="aarch64")
    assert install.choose(opts(), env).args == ["-DGGML_RPC=ON"]
