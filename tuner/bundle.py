"""`tuner bundle`: one archive that installs the tuner on a server without network.

The archive holds the project's tracked files, the wheels of its runtime dependencies for a named Python
version and platform (and of the build backend, so the install needs no index), the pinned llama.cpp
source archive with its sha256 in the manifest, and ``install.sh``, which checks the build tools, makes
``.venv`` from the wheels with ``pip --no-index`` and keeps the source where ``make llama`` looks for it.
The project is installed editable from its own files, as ``make setup`` does, because its folders
(models, reports, storage) live beside its code; a wheel of the project is only built to resolve its
dependencies. The archive is written under a temporary name and renamed once whole.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UserError
from tuner.eta import duration
from tuner.machine.llama_build import PINNED_SDIST_SHA256, SDIST_NAME, pinned_sdist, sha256_of
from tuner.output.files import human_bytes, write_error

# As pyproject.toml's build-system.requires: the editable install builds offline from this wheel.
BUILD_BACKEND = "setuptools>=68"
MIN_PYTHON = (3, 10)
INSTALL_TEMPLATE = Path(__file__).resolve().parent / "data" / "bundle" / "install.sh"
PLATFORM_TAG = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class Target:
    """The Python version and platform the wheels are for; ``platform`` None is this machine's own."""

    python_version: str
    platform: str | None = None
    extras: tuple[str, ...] = ()

    @property
    def platform_label(self) -> str:
        return self.platform or re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())

    @property
    def label(self) -> str:
        return f"py{self.python_version}-{self.platform_label}"

    def pip_options(self) -> list[str]:
        """pip download's target options: binary wheels only, so nothing is built on the server."""
        options = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp"]
        return options + (["--platform", self.platform] if self.platform else [])


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def make_target(python_version: str | None, platform: str | None, extras: list[str] | None) -> Target:
    """The target from the command line, each value checked before anything is downloaded."""
    given = python_version or this_python()
    match = re.fullmatch(r"3\.(\d{1,2})(\.\d+)?", given)
    if not match or (3, int(match.group(1))) < MIN_PYTHON:
        raise UserError(
            f"--python-version {given}: the tuner needs CPython 3.{MIN_PYTHON[1]} or newer, written X.Y; "
            "pass e.g. 3.12 (the server's `python3 --version`)"
        )
    version = f"3.{int(match.group(1))}"  # 3.12.7 (a Docker image's PYTHON_VERSION) is 3.12's wheels
    if platform is not None and not PLATFORM_TAG.fullmatch(platform):
        raise UserError(
            f"--platform {platform}: not a wheel platform tag; pass e.g. manylinux2014_x86_64 "
            "or manylinux_2_28_aarch64"
        )
    return Target(version, platform, tuple(sorted(set(extras or ()))))


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def project_files(root: Path) -> list[str]:
    """The files git tracks, as they are in the working tree (a file deleted there is left out)."""
    proc = _git(root, "ls-files", "-z")
    if proc.returncode != 0:
        raise UserError(
            f"{root}: not a git checkout (git ls-files failed); run `tuner bundle` in a clone of the project"
        )
    return [name for name in proc.stdout.split("\0") if name and (root / name).is_file()]


def git_revision(root: Path) -> str:
    """``abc1234``, with ``+changes`` when tracked files differ from that commit."""
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return _git(root, "rev-parse", "--short", "HEAD").stdout.strip() + ("+changes" if dirty else "")


def build_project_wheel(root: Path, files: list[str], scratch: Path) -> Path:
    """A wheel of the project built from a copy of its tracked files (the build's leftovers stay in the
    copy); pip download reads the project's dependencies and extras from it."""
    source = scratch / "source"
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, source / name)
    out = scratch / "project"
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(out.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise UserError(
            f"could not build the project's wheel ({_pip_error(proc.stderr)}); check pyproject.toml"
        )
    return wheels[0]


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """(version, extras) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    version = re.search(r"^Version: (.+)$", text, flags=re.MULTILINE)
    extras = re.findall(r"^Provides-Extra: (.+)$", text, flags=re.MULTILINE)
    return (version.group(1).strip() if version else "0"), [e.strip() for e in extras]


def download_wheels(project_wheel: Path, target: Target, dest: Path) -> list[Path]:
    """Every runtime dependency's wheel (the extras' too) and the build backend's, for the target; the
    project's own wheel is not kept (the install is editable)."""
    extras = f"[{','.join(target.extras)}]" if target.extras else ""
    cmd = [sys.executable, "-m", "pip", "download", "--progress-bar", "off", *target.pip_options()]
    cmd += ["-d", str(dest), f"{project_wheel}{extras}", BUILD_BACKEND]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    collected = 0
    tail: list[str] = []  # pip's last lines, for the error
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        if line.startswith(("Collecting", "Processing")):
            collected += 1
            if collected % 10 == 0:
                print(
                    f"bundle: {collected} packages so far ({duration(time.monotonic() - started)})",
                    flush=True,
                )
    if proc.wait() != 0:
        raise UserError(
            f"pip download for Python {target.python_version} on {target.platform_label} failed "
            f"({_pip_error(chr(10).join(tail))}); check --python-version and --platform (wheels must exist "
            "for both) and access to the package index"
        )
    (dest / project_wheel.name).unlink(missing_ok=True)
    return sorted(dest.glob("*.whl"))


def _pip_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def install_script(target: Target) -> str:
    """install.sh with this bundle's values filled in."""
    extras = f"[{','.join(target.extras)}]" if target.extras else ""
    values = {
        "@PYTHON_VERSION@": target.python_version,
        "@PLATFORM@": target.platform_label,
        "@EXTRAS@": extras,
        "@SDIST@": f"sources/{SDIST_NAME}",
    }
    text = INSTALL_TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def manifest(target: Target, version: str, revision: str, wheels: list[Path]) -> dict:
    """What the bundle holds, for whoever installs it: versions, the target, every archive's sha256."""
    return {
        "project": "llama-tuner",
        "version": version,
        "revision": revision,
        "python_version": target.python_version,
        "platform": target.platform_label,
        "extras": list(target.extras),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "llama_cpp_source": {"file": f"sources/{SDIST_NAME}", "sha256": PINNED_SDIST_SHA256},
        "wheels": {f"wheels/{w.name}": sha256_of(w) for w in wheels},
    }


def checksums(meta: dict) -> str:
    """SHA256SUMS in sha256sum's format: install.sh checks a copied bundle with it."""
    rows = {**meta["wheels"], meta["llama_cpp_source"]["file"]: meta["llama_cpp_source"]["sha256"]}
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(rows.items()))


def _neutral(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner of this machine in the archive."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_archive(path: Path, members: list[tuple[Path, str]]) -> None:
    """The archive under a temporary name in its folder, renamed once whole: a failed or interrupted
    write leaves no half archive under the real name."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
            for source, arcname in members:
                tar.add(source, arcname, recursive=False, filter=_neutral)
        partial.replace(path)
    except OSError as err:
        raise write_error(path, err) from None
    finally:
        partial.unlink(missing_ok=True)


def build_bundle(root: Path, out_dir: Path, target: Target) -> Path:
    """The bundle for ``target`` in ``out_dir``; progress lines for each long step."""
    started = time.monotonic()
    files, revision = project_files(root), git_revision(root)
    print(f"bundle: {len(files)} project files at {revision}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tuner-bundle-") as tmp:
        scratch = Path(tmp)
        project_wheel = build_project_wheel(root, files, scratch)
        version, known = wheel_metadata(project_wheel)
        unknown = [e for e in target.extras if e not in known]
        if unknown:
            raise UserError(
                f"--extra {unknown[0]}: not an extra of the project; pass one of {', '.join(known)}"
            )
        print(
            f"bundle: wheels for Python {target.python_version} on {target.platform_label} (pip download: "
            "a minute or two the first time, seconds from pip's cache)",
            flush=True,
        )
        wheels = download_wheels(project_wheel, target, scratch / "wheels")
        size = sum(w.stat().st_size for w in wheels)
        print(
            f"bundle: {len(wheels)} wheels, {human_bytes(size)} ({duration(time.monotonic() - started)})",
            flush=True,
        )
        sdist = pinned_sdist()
        meta = manifest(target, version, revision, wheels)
        for name, text in (
            ("install.sh", install_script(target)),
            ("bundle.json", json.dumps(meta, indent=2) + "\n"),
            ("SHA256SUMS", checksums(meta)),
        ):
            (scratch / name).write_text(text)
        (scratch / "install.sh").chmod(0o755)
        top = f"llama-tuner-bundle-{version}-{target.label}"
        members = [(root / name, f"{top}/{name}") for name in files]
        members += [(w, f"{top}/wheels/{w.name}") for w in wheels]
        members += [(sdist, f"{top}/sources/{SDIST_NAME}")]
        members += [(scratch / n, f"{top}/{n}") for n in ("install.sh", "bundle.json", "SHA256SUMS")]
        path = out_dir / f"{top}.tar.gz"
        print(f"bundle: writing {path} ({len(members)} files)", flush=True)
        write_archive(path, members)
    print(
        f"bundle: {path} ({human_bytes(path.stat().st_size)}) in {duration(time.monotonic() - started)}; "
        f"on the server: tar xzf {path.name} && {top}/install.sh",
        flush=True,
    )
    return path
