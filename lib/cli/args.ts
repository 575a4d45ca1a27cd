/**
 * A small argv reader for bwrap-style options, some of which take two or
 * more values (`--ro-bind SRC DST`): node:util's parseArgs cannot say that.
 */
import { MinisandboxError } from '../errors.js';

/** A command line the command cannot run: the message says which argument and why. */
export class UsageError extends MinisandboxError {
  static override readonly code = 'MSBX_USAGE';
}

export class ArgReader {
  #i = 0;
  constructor(private readonly argv: string[]) {}

  get done(): boolean {
    return this.#i >= this.argv.length;
  }

  peek(): string | undefined {
    return this.argv[this.#i];
  }

  next(): string {
    const v = this.argv[this.#i++];
    if (v === undefined) throw new UsageError('missing argument');
    return v;
  }

  /** The values of an option that takes `n` of them. */
  values(option: string, n: number): string[] {
    const out: string[] = [];
    for (let k = 0; k < n; k++) {
      const v = this.argv[this.#i++];
      if (v === undefined) throw new UsageError(`${option} needs ${n} value${n > 1 ? 's' : ''}`);
      out.push(v);
    }
    return out;
  }

  value(option: string): string {
    return this.values(option, 1)[0]!;
  }

  rest(): string[] {
    const r = this.argv.slice(this.#i);
    this.#i = this.argv.length;
    return r;
  }
}
