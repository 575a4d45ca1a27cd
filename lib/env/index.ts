/**
 * Environment layers: venvs (and the repo they serve) built once into the
 * layer store and stacked, with a private writable layer, into any number of
 * sandboxes. See docs/environments.md.
 */
export { EnvError } from './errors.js';
export { resolvePython, findPython, probePython, pythonCandidates, pythonSearchPath, pyenvRoots, type BasePython, type PythonQuery } from './python.js';
export { checkRecipe, checkEnvPath, DEFAULT_VENV_PATH, DEFAULT_REPO_PATH, type EnvRecipe, type EnvStep, type RepoSource, type CheckedRecipe } from './recipe.js';
export {
  loadEnv,
  listEnvs,
  removeEnv,
  envsDir,
  archiveFileFor,
  type Env,
  type EnvManifest,
  type EnvLayerRecord,
} from './manifest.js';
export { buildEnv, buildRepo, type BuildEnvOptions, type BuildRepoOptions, type RepoLayer } from './buildEnv.js';
export { packAsLayer, type PackedLayer } from './pack.js';
export { packRepoLayer, type PackRepoOptions, type RepoLayerInfo } from './gitRepo.js';
export { basePythonMounts, venvVariables } from './layout.js';
export {
  createEnvSandbox,
  EnvSandbox,
  type EnvSandboxOptions,
  type EnvSandboxSetup,
} from './sandboxFromEnv.js';
