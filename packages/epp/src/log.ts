// The logger every part of the picker takes: pino's (JSON lines on stderr in the bin), or a
// silent one in tests and embedders that pass none.

import { pino } from "pino";

export type Log = Pick<pino.Logger, "debug" | "info" | "warn" | "error">;

/** A logger that drops everything. */
export const silentLog: Log = pino({ level: "silent" });

/** JSON lines on stderr at `level`. */
export function stderrLog(level = "info"): Log {
  return pino({ level, base: { name: "airm-epp" } }, pino.destination(2));
}
