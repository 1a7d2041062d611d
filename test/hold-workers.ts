// vitest globalSetup of the configs whose tests start rigs (the root vitest.config.ts,
// test/k8s/vitest.config.ts, test/k8s-node/vitest.config.ts). It runs in vitest's main process:
// a signal that stops the run is passed on to the test workers, and the main process waits for
// them to run their rigs' teardowns before it exits; and when the pnpm that runs vitest is gone
// (pnpm passes its signal to no one but a shell), that is such a signal (scripts/rig-cleanup.ts).
import { holdWorkersOnSignal, stopWithPnpm } from "../scripts/rig-cleanup.ts";

export default function setup(): () => void {
  const unhold = holdWorkersOnSignal();
  const unwatch = stopWithPnpm();
  return () => {
    unwatch();
    unhold();
  };
}
