// The logger the pool reader takes: pino's, or any with its (object, message) methods.

type LogFn = (obj: object, msg?: string) => void;
export interface Log {
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
}

const drop: LogFn = () => {};
/** A logger that drops everything. */
export const silentLog: Log = { debug: drop, info: drop, warn: drop, error: drop };
