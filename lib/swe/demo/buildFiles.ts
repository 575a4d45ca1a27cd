/**
 * Packaging files for the demo repositories.
 *
 * Why an in-tree PEP 517/660 backend instead of setuptools: the task recipe
 * installs with `pip install --no-build-isolation --no-deps -e .` offline.
 * With build isolation off, setuptools < 70.1 (3.11's bundled 65.5) needs
 * the separate `wheel` package to build even an editable wheel, and a fresh
 * venv does not have it. A 60-line stdlib-only backend removes every build
 * dependency, so the install works in any venv of Python >= 3.7 with pip >= 21.3.
 */
import { source } from './spec.js';

export interface BuildConfig {
  name: string;
  version: string;
  /** Directory (relative to the repo root) holding the packages. */
  sourceRoot: string;
  packages: string[];
}

export function renderPyproject(config: BuildConfig): string {
  return source(`
[build-system]
requires = []
build-backend = "backend"
backend-path = ["_build"]

[project]
name = "${config.name}"
version = "${config.version}"
requires-python = ">=3.7"

[tool.pytest.ini_options]
testpaths = ["tests"]
`);
}

export function renderBuildBackend(config: BuildConfig): string {
  return source(String.raw`
"""Minimal in-tree PEP 517 / PEP 660 build backend (standard library only).

Lets "pip install --no-build-isolation --no-deps -e ." work offline in a
bare venv: no setuptools or wheel needed.
"""
import base64
import hashlib
import os
import zipfile

NAME = ${JSON.stringify(config.name)}
VERSION = ${JSON.stringify(config.version)}
SOURCE_ROOT = ${JSON.stringify(config.sourceRoot)}
PACKAGES = ${JSON.stringify(config.packages)}

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)
_TAG = "py3-none-any"


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (arcname, digest.decode("ascii"), len(data))


def _write_wheel(directory, files):
    metadata = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (NAME, VERSION)
    wheel = "Wheel-Version: 1.0\nGenerator: in-tree-backend\nRoot-Is-Purelib: true\nTag: %s\n" % _TAG
    files = list(files) + [
        (_DIST_INFO + "/METADATA", metadata.encode("utf-8")),
        (_DIST_INFO + "/WHEEL", wheel.encode("utf-8")),
    ]
    record = [_record_line(name, data) for name, data in files] + [_DIST_INFO + "/RECORD,,"]
    wheel_name = "%s-%s-%s.whl" % (NAME, VERSION, _TAG)
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w") as archive:
        for name, data in files:
            archive.writestr(name, data)
        archive.writestr(_DIST_INFO + "/RECORD", "\n".join(record) + "\n")
    return wheel_name


def _package_files():
    base = os.path.join(_ROOT, SOURCE_ROOT)
    for package in PACKAGES:
        for dirpath, _dirnames, filenames in os.walk(os.path.join(base, package)):
            for filename in sorted(filenames):
                if filename.endswith(".py"):
                    path = os.path.join(dirpath, filename)
                    with open(path, "rb") as handle:
                        yield os.path.relpath(path, base).replace(os.sep, "/"), handle.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source root on sys.path, so edits (and patches
    # applied after installation) take effect without reinstalling.
    pth = os.path.normpath(os.path.join(_ROOT, SOURCE_ROOT)) + "\n"
    return _write_wheel(wheel_directory, [("__editable__.%s.pth" % NAME, pth.encode("utf-8"))])
`);
}
