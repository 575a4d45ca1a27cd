/**
 * `minisandbox serve`: run the SWE-ReX-compatible server until SIGINT or
 * SIGTERM, then close every sandbox it created.
 */
import { ArgReader, UsageError } from '../cli/args.js';
import type { Limits } from '../sandbox/index.js';
import { startServer, type ServerOptions } from './server.js';

export const SERVE_HELP = `Usage: minisandbox serve --auth-token TOKEN [OPTIONS]

Serves the SWE-ReX remote-runtime protocol (what swerex-remote serves), so
SWE-agent, SWE-ReX's RemoteRuntime and RL trainers drive MiniSandbox
sandboxes unchanged. The root paths (/is_alive, /run_in_session, ...) use a
default sandbox created on first use; POST /sandboxes creates more, each
served under /sandboxes/<id>/. See docs/server.md.

Options:
  --auth-token TOKEN     required X-API-Key value ('' disables authentication)
  --host HOST            address to listen on (default 127.0.0.1)
  --port PORT            port (default 8000; 0 picks a free one)
  --max-sandboxes N      most sandboxes alive at once (default: no limit)
  --max-body-bytes N     largest JSON request body (default 16 MiB)
  --max-upload-bytes N   largest /upload body (default 512 MiB)
  --memory SIZE          memory limit of every sandbox (e.g. 2g)
  --pids N               process limit of every sandbox
  --cpu CORES            CPU limit of every sandbox (e.g. 1.5)
  --network none|host    network of every sandbox (default none)`;

function positiveInt(option: string, value: string, min = 1): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) throw new UsageError(`${option}: expected an integer >= ${min}, got '${value}'`);
  return n;
}

export function parseServeArgs(args: string[]): ServerOptions {
  const r = new ArgReader(args);
  let authToken: string | undefined;
  const opts: Omit<ServerOptions, 'authToken'> = {};
  const limits: Limits = {};
  let network: 'none' | 'host' | undefined;
  while (!r.done) {
    const arg = r.next();
    switch (arg) {
      case '--auth-token':
        authToken = r.value(arg);
        break;
      case '--host':
        opts.host = r.value(arg);
        break;
      case '--port':
        opts.port = positiveInt(arg, r.value(arg), 0);
        if (opts.port > 65535) throw new UsageError(`--port: ${opts.port} is not a port number`);
        break;
      case '--max-sandboxes':
        opts.maxSandboxes = positiveInt(arg, r.value(arg));
        break;
      case '--max-body-bytes':
        opts.maxBodyBytes = positiveInt(arg, r.value(arg));
        break;
      case '--max-upload-bytes':
        opts.maxUploadBytes = positiveInt(arg, r.value(arg));
        break;
      case '--memory':
        limits.memory = r.value(arg);
        break;
      case '--pids':
        limits.pids = positiveInt(arg, r.value(arg));
        break;
      case '--cpu': {
        const v = r.value(arg);
        const cpu = Number(v);
        if (!(cpu > 0)) throw new UsageError(`--cpu: expected a positive number of cores, got '${v}'`);
        limits.cpu = cpu;
        break;
      }
      case '--network': {
        const v = r.value(arg);
        if (v !== 'none' && v !== 'host') throw new UsageError(`--network: expected none or host, got '${v}'`);
        network = v;
        break;
      }
      default:
        throw new UsageError(`unknown option '${arg}'`);
    }
  }
  // As swerex-remote: the token must be chosen explicitly, even if empty.
  if (authToken === undefined) throw new UsageError('--auth-token is required');
  const sandboxDefaults = { ...(Object.keys(limits).length ? { limits } : {}), ...(network ? { network } : {}) };
  return { ...opts, authToken, sandboxDefaults };
}

export async function serveCommand(args: string[]): Promise<number> {
  const options = parseServeArgs(args);
  const server = await startServer(options);
  if (options.authToken === '') process.stderr.write('minisandbox serve: warning: authentication disabled (empty --auth-token)\n');
  process.stderr.write(`minisandbox serve: listening on ${server.url}\n`);
  await new Promise<void>((resolve) => {
    const stop = () => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  process.stderr.write('minisandbox serve: closing sandboxes\n');
  await server.close();
  return 0;
}
