/**
 * Real Python packages for env tests, built offline: each ships a tiny
 * stdlib-only PEP 517/660 backend (3.11's pip has no `wheel` package, so
 * setuptools cannot build without network) that can also compile a C
 * extension with gcc and write console-script entry points.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { resolvePython, type BasePython } from '../../lib/env/index.js';

const BACKEND = String.raw`
"""Stdlib-only PEP 517/660 backend for test packages (config in _build/config.json)."""
import base64, hashlib, json, os, subprocess, sys, sysconfig, tempfile, zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(_ROOT, "_build", "config.json")) as f:
    CFG = json.load(f)
NAME, VERSION, SRC = CFG["name"], CFG["version"], CFG.get("sourceRoot", ".")
DIST = NAME.replace("-", "_").replace(".", "_")  # wheel file names use the normalized name
DIST_INFO = "%s-%s.dist-info" % (DIST, VERSION)


def _tag():
    if not CFG.get("cext"):
        return "py3-none-any"
    impl = "cp%d%d" % sys.version_info[:2]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, impl, plat)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (name, digest.decode(), len(data))


def _wheel(directory, files):
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (NAME, VERSION)
    wheel = "Wheel-Version: 1.0\nGenerator: test-backend\nRoot-Is-Purelib: %s\nTag: %s\n" % (
        "false" if CFG.get("cext") else "true", _tag())
    files = list(files) + [(DIST_INFO + "/METADATA", meta.encode()), (DIST_INFO + "/WHEEL", wheel.encode())]
    scripts = CFG.get("scripts") or {}
    if scripts:
        ep = "[console_scripts]\n" + "".join("%s = %s\n" % kv for kv in sorted(scripts.items()))
        files.append((DIST_INFO + "/entry_points.txt", ep.encode()))
    record = [_record_line(n, d) for n, d in files] + [DIST_INFO + "/RECORD,,"]
    name = "%s-%s-%s.whl" % (DIST, VERSION, _tag())
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for n, d in files:
            z.writestr(n, d)
        z.writestr(DIST_INFO + "/RECORD", "\n".join(record) + "\n")
    return name


def _py_files():
    base = os.path.join(_ROOT, SRC)
    for pkg in CFG["packages"]:
        for dirpath, dirnames, filenames in os.walk(os.path.join(base, pkg)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    p = os.path.join(dirpath, fn)
                    with open(p, "rb") as h:
                        yield os.path.relpath(p, base).replace(os.sep, "/"), h.read()


def _extensions():
    out = []
    include = sysconfig.get_paths()["include"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for mod, src in sorted((CFG.get("cext") or {}).items()):
        tmp = tempfile.mkdtemp()
        so = os.path.join(tmp, mod.split(".")[-1] + suffix)
        subprocess.check_call(["gcc", "-shared", "-fPIC", "-O1", "-I", include, os.path.join(_ROOT, src), "-o", so])
        with open(so, "rb") as h:
            out.append((mod.replace(".", "/") + suffix, h.read()))
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, list(_py_files()) + _extensions())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    pth = os.path.normpath(os.path.join(_ROOT, SRC)) + "\n"
    return _wheel(wheel_directory, [("__editable__.%s.pth" % NAME, pth.encode())])
`;

export interface PackageSpec {
  name: string;
  version?: string;
  sourceRoot?: string;
  packages: string[];
  /** console script name -> "module:function" */
  scripts?: Record<string, string>;
  /** extension module (dotted) -> C source path relative to the package root */
  cext?: Record<string, string>;
  /** Extra files, relative to the package root. */
  files: Record<string, string>;
}

export function writePackage(dir: string, spec: PackageSpec): void {
  const files: Record<string, string> = {
    'pyproject.toml': `[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["_build"]\n\n[project]\nname = "${spec.name}"\nversion = "${spec.version ?? '0.1'}"\n`,
    '_build/backend.py': BACKEND,
    '_build/config.json': JSON.stringify({ name: spec.name, version: spec.version ?? '0.1', sourceRoot: spec.sourceRoot ?? '.', packages: spec.packages, scripts: spec.scripts ?? {}, cext: spec.cext ?? {} }),
    ...spec.files,
  };
  for (const [rel, content] of Object.entries(files)) {
    const abs = path.join(dir, rel);
    mkdirSync(path.dirname(abs), { recursive: true });
    writeFileSync(abs, content);
  }
}

/** Build a wheel of the package at `dir` on the host into `outDir`. */
export function buildWheel(python: string, dir: string, outDir: string): string {
  mkdirSync(outDir, { recursive: true });
  return execFileSync(python, ['-c', 'import sys; sys.path.insert(0, "_build"); import backend; print(backend.build_wheel(sys.argv[1]))', outDir], { cwd: dir, encoding: 'utf8' }).trim();
}

export function gitRepo(dir: string, files: PackageSpec): string {
  writePackage(dir, files);
  const git = (...args: string[]) =>
    execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'init.defaultBranch=main', ...args], { cwd: dir, encoding: 'utf8' }).trim();
  git('init', '-q');
  git('add', '-A');
  git('commit', '-q', '-m', 'initial');
  return git('rev-parse', 'HEAD');
}

/** A base Python for venvs: 3.11 (pyenv or Debian), else any 3.x; with the reason when none. */
export function basePython(): { python?: BasePython; reason?: string } {
  const errors: string[] = [];
  for (const v of ['3.11', '3']) {
    try {
      return { python: resolvePython(v) };
    } catch (err) {
      errors.push((err as Error).message);
    }
  }
  return { reason: `no usable base Python for venvs: ${errors.join('; ')}` };
}

/** gcc and the interpreter's Python.h are both there (pyenv: include/python3.11). */
export function canCompile(python: BasePython): boolean {
  if (spawnSync('gcc', ['--version']).status !== 0) return false;
  const inc = spawnSync(python.path, ['-c', 'import sysconfig; print(sysconfig.get_paths()["include"])'], { encoding: 'utf8' }).stdout.trim();
  return inc !== '' && existsSync(path.join(inc, 'Python.h'));
}
