export {
  createDemoTaskSet,
  DEMO_INSTALL,
  DEMO_MODEL_NAME,
  DEMO_PYTHON,
  DEMO_REPO_SPECS,
  type DemoPartialFix,
  type DemoTaskSet,
} from './createDemoTaskSet.js';
export type { DemoRepoSpec } from './spec.js';
export { renderBuildBackend, renderPyproject, type BuildConfig } from './buildFiles.js';
