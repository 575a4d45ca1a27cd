/** A SWE-ReX-compatible HTTP server over MiniSandbox sandboxes. */
export { startServer, type ClusterOptions, type RunningServer, type ServerOptions } from './server.js';
export { SandboxRegistry, ManagedSandbox, type RegistryOptions } from './registry.js';
