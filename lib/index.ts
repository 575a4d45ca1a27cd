/**
 * MiniSandbox: container-free sandboxes for software-engineering agents.
 *
 * - `spawn` / `run`: one command in a fresh sandbox (lib/sandbox).
 * - `native`: the raw plan executor, for libraries that want syscall-level control.
 * - `MinisandboxError`: the base of every error the library throws, each
 *   with a stable `code` (docs/architecture.md lists them).
 */
export { MinisandboxError } from './errors.js';
export * from './sandbox/index.js';
export { native, type NativePlan, type NativeOp, type NamespaceName } from './native/index.js';
