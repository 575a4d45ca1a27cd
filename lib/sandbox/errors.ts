/**
 * Errors a sandbox can raise. Each names the thing and the reason, so a
 * caller never has to decode an exit status to learn what went wrong.
 */
import { getSystemErrorMap } from 'node:util';

const errnoNames = new Map<number, [string, string]>();
for (const [negErrno, entry] of getSystemErrorMap()) errnoNames.set(-negErrno, entry);

/** "ENOENT (no such file or directory)" for 2. */
export function describeErrno(errno: number): string {
  const entry = errnoNames.get(errno);
  return entry ? `${entry[0]} (${entry[1]})` : `errno ${errno}`;
}

export function errnoCode(errno: number): string {
  return errnoNames.get(errno)?.[0] ?? `E${errno}`;
}

export class SandboxError extends Error {
  override name = 'SandboxError';
}

/** Options that cannot describe a valid sandbox; nothing was started. */
export class ConfigError extends SandboxError {
  override name = 'ConfigError';
  constructor(
    message: string,
    /** The option at fault, as a dotted path (`mounts[2].source`). */
    readonly option?: string,
  ) {
    super(message);
  }
}

/** A setup step failed inside the new namespaces, before the command ran. */
export class SetupError extends SandboxError {
  override name = 'SetupError';
  readonly code: string;
  constructor(
    message: string,
    readonly step: string,
    readonly errno: number,
    readonly detail = '',
  ) {
    super(message);
    this.code = errnoCode(errno);
  }
}

/** A mount of the plan failed: `MountError: bind /data -> /mnt: ENOENT`. */
export class MountError extends SetupError {
  override name = 'MountError';
}

/** The command itself could not be executed. */
export class ExecError extends SetupError {
  override name = 'ExecError';
}

/** The kernel refused to create the namespaces (user namespaces disabled...). */
export class NamespaceError extends SandboxError {
  override name = 'NamespaceError';
  constructor(
    message: string,
    readonly code?: string,
  ) {
    super(message);
  }
}
