// When a long-running rngd-pd process (worker, gateway, relay) should stop: SIGINT, SIGTERM, or,
// for a process started by a supervisor that set AIRM_PARENT_PID, that supervisor being gone
// (a SIGKILLed `airm up` must not leave its parts holding their ports).

import { RM_CORE_CONFIG } from "./rm-core-config.ts";

/**
 * Resolves with the reason ("SIGINT", "SIGTERM" or "parent exited") once the process should stop.
 * The parent check polls `process.ppid` every `pollMs` (it changes when the parent dies).
 */
export function untilStopSignal(env: NodeJS.ProcessEnv | Record<string, string | undefined>, pollMs = 500): Promise<string> {
  return new Promise((resolve) => {
    const parent = RM_CORE_CONFIG.resolve({ env }).parentPid ?? 0;
    let timer: NodeJS.Timeout | undefined;
    const done = (why: string) => {
      process.off("SIGINT", onInt);
      process.off("SIGTERM", onTerm);
      if (timer) clearInterval(timer);
      resolve(why);
    };
    const onInt = () => done("SIGINT");
    const onTerm = () => done("SIGTERM");
    process.once("SIGINT", onInt);
    process.once("SIGTERM", onTerm);
    if (Number.isInteger(parent) && parent > 1) {
      timer = setInterval(() => {
        if (process.ppid !== parent) done("parent exited");
      }, pollMs);
      timer.unref();
    }
  });
}
