"""Check a built wheel: every package folder of the source tree is in it, with its data files (models.yaml,
the page at / of `serve`), and the wheel installed on its own (into a scratch folder, no editable install
in front) runs `specgguf --help` and `--version` and, with --run, answers a prompt with the default pair.

    python scripts/check_wheel.py build/wheel/specgguf-*.whl [--run]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = (".yaml", ".html", ".css", ".js")  # pyproject's [tool.setuptools.package-data]
# shipped whole (licences, attachments, traces)
DATA_FOLDERS = ("specgguf/bench/suite", "specgguf/bench/traces", "specgguf/serve/page/vendor")


def main(wheel: Path, *, run: bool) -> int:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "specgguf").rglob("__init__.py"))
    missing = [package for package in packages if f"{package}/__init__.py" not in names]
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specgguf").rglob("*.py"))
    missing += [module for module in modules if module not in names]
    data = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specgguf").rglob("*") if p.suffix in DATA_SUFFIXES)
    for folder in DATA_FOLDERS:
        data += [str(p.relative_to(ROOT)) for p in sorted((ROOT / folder).iterdir()) if p.is_file()]
    missing += [name for name in data if name not in names]
    if missing:
        print(f"{wheel.name} lacks: {', '.join(missing)}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as target:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, str(wheel)], check=True
        )
        env = {**os.environ, "PYTHONPATH": target}
        where = subprocess.run(
            [sys.executable, "-c", "import specgguf; print(specgguf.__file__)"],
            env=env,
            cwd=target,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not where.startswith(target):
            print(f"the check imported specgguf from {where}, not from the wheel", file=sys.stderr)
            return 1
        result = subprocess.run(
            [sys.executable, "-m", "specgguf", "--help"], env=env, cwd=target, capture_output=True, text=True
        )
        if result.returncode != 0 or "Usage" not in result.stdout:
            print(f"`specgguf --help` from the wheel failed:\n{result.stdout}{result.stderr}", file=sys.stderr)
            return 1
        version = wheel.name.split("-")[1]  # name-version-python-abi-platform.whl
        result = subprocess.run(
            [sys.executable, "-m", "specgguf", "--version"], env=env, cwd=target, capture_output=True, text=True
        )
        if result.returncode != 0 or result.stdout != f"specgguf {version}\n":
            print(f"`specgguf --version` from the wheel failed:\n{result.stdout}{result.stderr}", file=sys.stderr)
            return 1
        if run:
            command = [sys.executable, "-m", "specgguf", "run", "-n", "16", "--temp", "0", "Say hello."]
            result = subprocess.run(command, env=env, cwd=target, capture_output=True, text=True)
            if result.returncode != 0 or not result.stdout.strip():
                print(f"`specgguf run` from the wheel failed:\n{result.stdout}{result.stderr}", file=sys.stderr)
                return 1
            print(f"`specgguf run` from the wheel answered: {result.stdout.strip()[:60]!r}")
    print(
        f"{wheel.name}: {len(packages)} packages, {len(modules)} modules, {len(data)} data files;"
        f" `specgguf --help` and `--version` run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), run="--run" in sys.argv[2:]))
