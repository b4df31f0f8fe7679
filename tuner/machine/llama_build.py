"""The pinned llama.cpp: fetch its source, build the tools the tuner runs, cache them.

The source is the PyPI source distribution of llama-cpp-python at an exact version,
which vendors llama.cpp under ``vendor/llama.cpp``. It is built once per (version,
flags, tools, CPU model) into the user's cache; a ``manifest.json`` written last marks
a finished build and records what every study stores as its build provenance. An
interrupted build resumes where cmake left off.

A user's own build is first-class: ``--bin-dir`` or ``LLAMA_CPP_BIN`` points at a
folder of llama.cpp binaries, whose version is read from the binaries themselves.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tuner.errors import MissingBinaryError, UserError
from tuner.eta import duration
from tuner.paths import cache_dir

PINNED_PACKAGE = "llama-cpp-python"
PINNED_VERSION = "0.3.36"
PINNED_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The upstream llama.cpp commit that llama-cpp-python 0.3.36 vendors (its CHANGELOG).
# The sdist carries no .git, so it is passed to cmake to make `--version` truthful.
PINNED_LLAMA_COMMIT = "0c1e570"
SDIST_NAME = f"llama_cpp_python-{PINNED_VERSION}.tar.gz"

TOOLS = (
    "llama-server",
    "llama-bench",
    "llama-cli",
    "llama-completion",
    "llama-speculative",
    "llama-perplexity",
    "llama-quantize",
    "llama-tokenize",
    "llama-lookup",
)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    f"-DLLAMA_BUILD_COMMIT={PINNED_LLAMA_COMMIT}",
    # Without AMX: some VMs list it in /proc/cpuinfo but fault on it (a Firecracker guest here: SIGILL in
    # ggml's tinygemm_kernel_amx on the first matmul). ggml uses AMX for batched matmuls (prompts), not
    # for single-token decode (an AVX512-VNNI path); an operator who wants it points LLAMA_CPP_BIN at a build.
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
ENV_BIN_DIR = "LLAMA_CPP_BIN"


@dataclass(frozen=True)
class BinaryVersion:
    """What a llama.cpp binary says of itself with ``--version``."""

    version: str
    build_number: int
    commit: str
    compiler: str
    target: str


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_key() -> str:
    """Cache key: a native build is only valid for this version, flags, tools and CPU."""
    ident = json.dumps([PINNED_VERSION, CMAKE_FLAGS, TOOLS, platform.machine(), _cpu_model()], sort_keys=True)
    return f"{PINNED_VERSION}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def pinned_root() -> Path:
    return cache_dir() / "llama.cpp" / build_key()


def pinned_bin_dir() -> Path:
    return pinned_root() / "build" / "bin"


def source_dir() -> Path:
    """The pinned llama.cpp source tree (fetched on first use)."""
    src = cache_dir() / "llama.cpp" / "src" / f"llama_cpp_python-{PINNED_VERSION}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        _fetch_source(src.parent.parent)
    return src


def _fetch_source(dest: Path) -> None:
    """Extract the pinned sdist (from the cache, downloaded the first time) atomically."""
    archive = pinned_sdist()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        extracted = Path(tmp) / f"llama_cpp_python-{PINNED_VERSION}"
        if dest.exists():
            shutil.rmtree(dest)
        extracted.rename(dest)


def sdist_path() -> Path:
    """Where the pinned source archive is kept: an offline host finds it here (``tuner llama --sdist``)."""
    return cache_dir() / "llama.cpp" / "sdist" / SDIST_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as archive:
        for block in iter(lambda: archive.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pinned_sdist() -> Path:
    """The pinned source archive in the cache, hash checked; downloaded with pip the first time."""
    path = sdist_path()
    if not path.is_file():
        _download_sdist(path)
    digest = sha256_of(path)
    if digest != PINNED_SDIST_SHA256:
        raise UserError(
            f"{path}: sha256 {digest} is not the pinned {PINNED_SDIST_SHA256}; delete it and run again"
        )
    return path


def keep_sdist(archive: Path) -> Path:
    """Put a copy of the pinned source archive (an offline bundle's) in the cache once its hash matches,
    so that a build needs no network."""
    if not archive.is_file():
        raise UserError(f"--sdist {archive}: no such file; pass the {SDIST_NAME} of an offline bundle")
    digest = sha256_of(archive)
    if digest != PINNED_SDIST_SHA256:
        raise UserError(
            f"--sdist {archive}: sha256 {digest} is not the pinned {PINNED_SDIST_SHA256}; "
            f"pass {PINNED_PACKAGE} {PINNED_VERSION}'s source archive"
        )
    path = sdist_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or sha256_of(path) != digest:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        shutil.copyfile(archive, tmp)
        tmp.replace(path)
    return path


def _download_sdist(path: Path) -> None:
    """Download the pinned sdist with pip into ``path``, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        print(f"llama.cpp: fetching {PINNED_PACKAGE}=={PINNED_VERSION} source distribution", flush=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{PINNED_PACKAGE}=={PINNED_VERSION}",
            "-d",
            tmp,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or not archives:
            raise UserError(
                f"could not download {PINNED_PACKAGE}=={PINNED_VERSION} from the package index "
                f"({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no archive'}); "
                f"check network access to PyPI, pass an offline bundle's archive with `tuner llama --sdist`, "
                f"or set {ENV_BIN_DIR} to your own llama.cpp build"
            )
        digest = sha256_of(archives[0])
        if digest != PINNED_SDIST_SHA256:
            raise UserError(f"{archives[0].name}: sha256 {digest} is not the pinned {PINNED_SDIST_SHA256}")
        archives[0].replace(path)


def read_binary_version(binary_path: Path) -> BinaryVersion:
    """Run ``BINARY --version``; llama.cpp prints its build info on stderr."""
    try:
        proc = subprocess.run([str(binary_path), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as err:
        raise MissingBinaryError(
            f"{binary_path}: cannot run ({err.strerror}); rebuild with `make llama`"
        ) from err
    text = proc.stderr + proc.stdout
    match = re.search(r"version: (\S+) \(build (\d+), commit (\S+)\)", text)
    if not match:
        raise MissingBinaryError(
            f"{binary_path}: `--version` printed no llama.cpp build info; is it a llama.cpp tool?"
        )
    built = re.search(r"built with (.+) for (.+)", text)
    return BinaryVersion(
        version=match.group(1),
        build_number=int(match.group(2)),
        commit=match.group(3),
        compiler=built.group(1).strip() if built else "unknown",
        target=built.group(2).strip() if built else "unknown",
    )


# A flag in llama.cpp's usage text: ``-t,    --threads N``, ``--no-webui``, ``-fa, --flash-attn [on|off|auto]``.
HELP_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


def server_flags(server: Path) -> frozenset[str]:
    """The long flags ``SERVER --help`` lists: what this build accepts, read from the build itself, once per binary
    (path, size and mtime). Why: llama.cpp changes its flags and their defaults between builds (one turns
    ``ngram-mod`` speculation on by default and adds ``--no-spec-type``), and an argv is built for the build in use.
    Empty when the binary lists none (a stand-in that has no usage text): nothing can be checked then."""
    stat = server.stat()
    return _server_flags(str(server.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _server_flags(server: str, size: int, mtime_ns: int) -> frozenset[str]:
    try:
        proc = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MissingBinaryError(
            f"{server}: `--help` did not answer ({err}); is it a llama.cpp tool?"
        ) from err
    return frozenset(HELP_FLAG.findall(proc.stdout + proc.stderr))


def build_label(build: Mapping) -> str:
    """A build in words, for one-line errors: ``llama.cpp 0c1e570 (build 1, /path/bin)``."""
    return f"llama.cpp {build.get('commit')} (build {build.get('build_number')}, {build.get('bin_dir')})"


def build_pinned(force: bool = False, jobs: int | None = None) -> dict:
    """Build the pinned tools unless a finished build is cached; return its manifest."""
    root = pinned_root()
    manifest_path = root / "manifest.json"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `make llama` at once: the second waits, then reuses
        if manifest_path.is_file() and not force and all((pinned_bin_dir() / t).is_file() for t in TOOLS):
            return json.loads(manifest_path.read_text())
        manifest_path.unlink(missing_ok=True)
        require_build_tools()
        src = source_dir()
        build = root / "build"
        log_path = root / "build.log"
        started = time.monotonic()
        with open(log_path, "w") as log:
            print(f"llama.cpp: configuring in {build} (log: {log_path})", flush=True)
            run_logged(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], log)
            jobs = jobs or os.cpu_count() or 2
            print(
                f"llama.cpp: building {len(TOOLS)} tools with {jobs} jobs (5-12 min on 2 cores, less with more)",
                flush=True,
            )
            run_logged(
                ["cmake", "--build", str(build), "-j", str(jobs), "--target", *TOOLS], log, progress=True
            )
        version = read_binary_version(pinned_bin_dir() / "llama-server")
        manifest = {
            "source": f"{PINNED_PACKAGE}=={PINNED_VERSION} sdist (vendor/llama.cpp)",
            "sdist_sha256": PINNED_SDIST_SHA256,
            "commit": version.commit,
            "build_number": version.build_number,
            "version": version.version,
            "compiler": version.compiler,
            "target": version.target,
            "cmake_flags": list(CMAKE_FLAGS),
            "tools": list(TOOLS),
            "cpu_model": _cpu_model(),
            "build_key": build_key(),
            "bin_dir": str(pinned_bin_dir()),
            "build_seconds": round(time.monotonic() - started, 1),
        }
        tmp = manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.rename(manifest_path)  # written last: its presence means the build finished
        return manifest


def require_build_tools() -> None:
    missing = [tool for tool in ("cmake", "c++", "make") if shutil.which(tool) is None]
    if missing:
        raise UserError(
            f"building llama.cpp needs {', '.join(missing)}; install with "
            "`apt-get install cmake build-essential` (or run `make setup`)"
        )


def run_logged(cmd: list[str], log, progress: bool = False) -> None:
    """Run a build step, its output into the log; show coarse progress with the time elapsed and left (the
    time so far scaled by the percent to go); fail with the log tail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    shown = -10
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        tail = (tail + [line.rstrip()])[-15:]
        pct = re.match(r"\[\s*(\d+)%\]", line)
        if progress and pct and int(pct.group(1)) >= shown + 10:
            shown = int(pct.group(1))
            print(f"llama.cpp: {shown}% ({build_eta(time.monotonic() - started, shown)})", flush=True)
    if proc.wait() != 0:
        raise UserError(f"`{' '.join(cmd[:3])} ...` failed:\n" + "\n".join(tail))


def build_eta(elapsed: float, percent: int) -> str:
    """``1m05s elapsed, ~9m left``: what is left at the pace so far (before any percent: unknown)."""
    left = f", ~{duration(elapsed * (100 - percent) / percent)} left" if percent > 0 else ""
    return f"{duration(elapsed)} elapsed{left}"


def resolve_bin_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The llama.cpp binaries in use: explicit option, then $LLAMA_CPP_BIN, then the pinned build."""
    chosen = explicit or os.environ.get(ENV_BIN_DIR)
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            origin = "--bin-dir" if explicit else ENV_BIN_DIR
            raise MissingBinaryError(
                f"{origin}={chosen}: not a directory; point it at the folder holding llama-server"
            )
        return path
    if (pinned_root() / "manifest.json").is_file():
        return pinned_bin_dir()
    raise MissingBinaryError(
        f"no llama.cpp build found: run `make llama` to build the pinned one, or set {ENV_BIN_DIR}=/path/to/bin"
    )


def binary(name: str, bin_dir: str | os.PathLike | None = None) -> Path:
    """Path of one llama.cpp tool; a clear error if it is not there."""
    folder = resolve_bin_dir(bin_dir)
    path = folder / name
    if path.is_file() and not os.access(path, os.X_OK):
        raise MissingBinaryError(
            f"{path}: {name} exists but is not executable; chmod +x it or point {ENV_BIN_DIR} at a build's bin/ folder"
        )
    if not path.is_file():
        raise MissingBinaryError(
            f"{path}: {name} not found; build it with `make llama` or add it to your build in {ENV_BIN_DIR}"
        )
    return path


def find_build_info(bin_dir: str | os.PathLike | None = None) -> dict:
    """Provenance of the build in use: the pinned manifest, or what a user build says of itself."""
    folder = resolve_bin_dir(bin_dir)
    manifest_path = folder.parent.parent / "manifest.json"
    flags = {"server_flags": sorted(server_flags(binary("llama-server", folder)))}
    if folder == pinned_bin_dir() and manifest_path.is_file():
        return {**json.loads(manifest_path.read_text()), **flags}
    version = read_binary_version(binary("llama-server", folder))
    return {
        "source": "user build",
        "commit": version.commit,
        "build_number": version.build_number,
        "version": version.version,
        "compiler": version.compiler,
        "target": version.target,
        "cmake_flags": "unknown (user build)",
        "bin_dir": str(folder),
        **flags,
    }
