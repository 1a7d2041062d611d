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
    // The handlers stay after the first signal: a signal to the whole process group arrives more
    // than once (the group's, then the launcher's own stop), and the later ones must not cut the
    // stop short with the default action (the launcher sends SIGKILL after its grace period).
    let stopped = false;
    const done = (why: string) => {
      if (stopped) return;
      stopped = true;
      if (timer) clearInterval(timer);
      resolve(why);
    };
    process.on("SIGINT", () => done("SIGINT"));
    process.on("SIGTERM", () => done("SIGTERM"));
    if (Number.isInteger(parent) && parent > 1) {
      timer = setInterval(() => {
        if (process.ppid !== parent) done("parent exited");
      }, pollMs);
      timer.unref();
    }
  });
}
