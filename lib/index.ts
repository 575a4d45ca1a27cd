/**
 * MiniSandbox: container-free sandboxes for software-engineering agents.
 *
 * - `spawn` / `run`: one command in a fresh sandbox (lib/sandbox).
 * - `native`: the raw plan executor, for libraries that want syscall-level control.
 */
export * from './sandbox/index.js';
export { native, type NativePlan, type NativeOp, type NamespaceName } from './native/index.js';
