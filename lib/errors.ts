/**
 * The base of every error MiniSandbox throws on purpose.
 *
 * One `instanceof MinisandboxError` tells "the library refused or failed,
 * and says why" from a bug; `code` tells the kinds apart where `instanceof`
 * cannot reach (a JSON report, another copy of the package, a log line).
 *
 * `code` follows Node's own convention: an error that is a failed system
 * call carries its errno name, as Node's fs errors do (`SetupError` and its
 * subclasses: 'ENOENT', 'EPERM'...); every other error carries an 'MSBX_'
 * code naming its kind, declared once per class (`static code`). Codes are
 * part of the API: docs/architecture.md lists them, and renaming one is a
 * breaking change.
 */
export class MinisandboxError extends Error {
  /** The code of errors of this class that do not give their own. */
  static readonly code: string = 'MSBX_ERROR';

  readonly code: string;

  constructor(message: string, options: { cause?: unknown; code?: string } = {}) {
    super(message, 'cause' in options ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof MinisandboxError).code;
  }
}

/** The `code` of an error (a Node system error's errno name, or a MinisandboxError's code), if it has one. */
export function codeOf(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err) {
    const code = (err as { code: unknown }).code;
    return typeof code === 'string' ? code : undefined;
  }
  return undefined;
}

/**
 * `err` as an error of the caller's room (`Kind`, its message kept and the
 * original as `cause`) when it is another room's MinisandboxError, so that a
 * method throws its own room's class; anything else, a bug included, is
 * returned as it is. Use: `catch (err) { throw adopt(err, LayerError); }`.
 */
export function adopt(err: unknown, Kind: new (message: string, options?: { cause?: unknown }) => MinisandboxError): unknown {
  if (!(err instanceof MinisandboxError) || err instanceof Kind) return err;
  return new Kind((err as MinisandboxError).message, { cause: err });
}
